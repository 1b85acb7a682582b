"""requirements/test.txt, the versions `make` installs, pins every requirement of pyproject.toml.

The lock is written by ``make lock`` (uv, from pyproject.toml with every extra, plus pip, torch's
CPU build and the build backend); pyproject.toml keeps the ranges users get. A requirement added
or a range changed without ``make lock`` fails here, as does a lock that took torch's CUDA build.
"""

from __future__ import annotations

import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.paths import ROOT

tomllib = pytest.importorskip("tomllib")

LOCK = ROOT / "requirements" / "test.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s#;]+)")


def _pins() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        found = PIN.match(line)
        if found:
            pins[canonicalize_name(found[1])] = Version(found[2])
    return pins


def _requirements() -> list[Requirement]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    texts = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        texts += extra
    texts += pyproject["build-system"]["requires"]
    return [Requirement(text) for text in texts]


def test_every_requirement_is_pinned_within_its_range():
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        if name == "memplan":  # an extra naming another extra
            continue
        assert name in pins, f"{requirement}: not in {LOCK.name}: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{requirement}: {LOCK.name} pins {pins[name]}: run make lock"
        )


def test_the_lock_pins_torch_cpu_build_and_the_installer():
    pins = _pins()
    assert not [name for name in pins if name.startswith("nvidia-") or name == "triton"]
    assert not pins["torch"].local, "pinned without +cpu, the same pin wherever it installs"
    assert "pip" in pins and "pytest-randomly" in pins
