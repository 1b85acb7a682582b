"""Every bundled profile x algorithm at two budgets prints what it printed before (issue 16).

The fixtures (tests/golden/) were made by ``python -m tests.golden.regenerate`` on the code before
the family protocol; each case is solved again here and its JSON compared byte for byte,
``solver.seconds`` aside. CP-SAT algorithms run with a deterministic limit, and the heavy cases
(seconds each) only with ``MEMPLAN_GOLDEN=all``: see NOTE [ golden schedules ] in
tests/golden/cases.py.
"""

from __future__ import annotations

import os

import pytest

import memplan
from memplan.profile import bundled_profiles
from memplan.profile.model import CHAIN_FAMILIES
from tests.golden.cases import (
    CPSAT_ALGORITHMS,
    FIXTURES,
    deterministic_cpsat,
    fixture_path,
    heavy,
    load_manifest,
    ortools_version,
    render,
)

MANIFEST = load_manifest()
EVERY_CASE = MANIFEST["cases"]
FULL = os.environ.get("MEMPLAN_GOLDEN", "") == "all"
CASES = [case for case in EVERY_CASE if FULL or not heavy(case)]


@pytest.fixture(scope="module")
def cpsat():
    with deterministic_cpsat():
        yield


@pytest.fixture(scope="module")
def profiles():
    """Each bundled profile loaded once (the graph profiles take most of a case's time)."""
    loaded: dict[str, memplan.Profile] = {}

    def load(name: str) -> memplan.Profile:
        if name not in loaded:
            loaded[name] = memplan.load_profile(name)
        return loaded[name]

    return load


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_the_schedule_is_what_it_was(case, cpsat, profiles):
    if case["algo"] in CPSAT_ALGORITHMS and ortools_version() != MANIFEST["ortools"]:
        pytest.skip(f"CP-SAT fixtures were made with OR-Tools {MANIFEST['ortools']}")
    assert render(case, profiles(case["profile"])) == fixture_path(case).read_text()


def test_the_cases_cover_every_bundled_profile_and_algorithm():
    """Two cases per algorithm of every family that fits each bundled profile; no stray file.

    A profile is served either by the four chain-model families (chain, offload, combined,
    pipeline), or by the join family, or by the graph family (``Profile.families``).
    """
    shapes = [set(CHAIN_FAMILIES), {"join"}, {"graph"}]
    by_family: dict[str, set[str]] = {}
    for entry in memplan.list_algorithms():
        by_family.setdefault(entry["family"], set()).add(entry["name"])
    listed: dict[str, set[tuple[str, int]]] = {}
    families: dict[str, set[str]] = {}
    for case in EVERY_CASE:
        profile, algo, index = case["id"].split("/")
        listed.setdefault(profile, set()).add((algo, int(index)))
        families.setdefault(profile, set()).add(case["family"])
        assert algo in by_family[case["family"]]
    assert set(listed) == set(bundled_profiles())
    for profile, found in families.items():
        assert found in shapes, profile
        wanted = {(algo, i) for family in found for algo in by_family[family] for i in (0, 1)}
        assert listed[profile] == wanted, profile
    files = {path for path in FIXTURES.rglob("*.json")}
    assert files == {fixture_path(case) for case in EVERY_CASE}


def test_the_fixtures_hold_feasible_and_infeasible_plans():
    """The budgets are chosen so that both outcomes are compared (and errors are none)."""
    texts = [fixture_path(case).read_text() for case in EVERY_CASE]
    assert not [t for t in texts if t.startswith("error:")]
    feasible = sum('"feasible": true' in t for t in texts)
    infeasible = sum('"feasible": false' in t for t in texts)
    assert feasible > len(texts) // 2
    assert infeasible > len(texts) // 10
