"""Fixtures of the command line's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import memplan
from memplan.profile.synthetic import random_chain


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    """Errors are one line: ``MEMPLAN_DEBUG`` set by the caller's shell would add tracebacks."""
    monkeypatch.delenv("MEMPLAN_DEBUG", raising=False)


@pytest.fixture
def net(tmp_path) -> Path:
    """A small random chain (6 stages, sizes up to 1000 bytes) saved as a profile, without a
    bandwidth (as measured on a CPU)."""
    path = tmp_path / "net.yaml"
    memplan.save_profile(random_chain(6, seed=3, max_size=1000), path)
    return path
