"""Every bundled profile x algorithm at two budgets gives the plan it gave before.

Each case is solved again here and summarized (tests/golden/summary.txt: outcome, makespan, peak
and least memory, status, digests of the plan and of the rest of the JSON), which must equal the
recorded line; a handful of small cases (tests/golden/schedules/) are compared whole, byte for
byte, ``solver.seconds`` aside. CP-SAT algorithms run with a deterministic limit, and the heavy
cases (seconds each) are marked slow: see NOTE [ golden schedules ] in tests/golden/cases.py.
"""

from __future__ import annotations

import pytest

import memplan
from memplan.profile import bundled_profiles
from memplan.profile.model import CHAIN_FAMILIES
from tests.golden.cases import (
    CPSAT_ALGORITHMS,
    FULL_SCHEDULES,
    SCHEDULES,
    deterministic_cpsat,
    heavy,
    load_manifest,
    ortools_version,
    read_summary,
    render,
    schedule_path,
    summary_line,
)

MANIFEST = load_manifest()
EVERY_CASE = MANIFEST["cases"]
BY_ID = {case["id"]: case for case in EVERY_CASE}
RECORDED = read_summary()


def _param(case):
    marks = [pytest.mark.slow] if heavy(case) else []
    return pytest.param(case, marks=marks, id=case["id"])


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


def _render(case, profiles) -> str:
    if case["algo"] in CPSAT_ALGORITHMS and ortools_version() != MANIFEST["ortools"]:
        pytest.skip(f"CP-SAT plans were recorded with OR-Tools {MANIFEST['ortools']}")
    return render(case, profiles(case["profile"]))


@pytest.mark.parametrize("case", [_param(case) for case in EVERY_CASE])
def test_the_plan_is_what_it_was(case, cpsat, profiles):
    assert summary_line(case["id"], _render(case, profiles)) == RECORDED[case["id"]]


@pytest.mark.parametrize("case_id", FULL_SCHEDULES)
def test_the_whole_schedule_is_what_it_was(case_id, cpsat, profiles):
    text = _render(BY_ID[case_id], profiles)
    assert text == schedule_path(case_id).read_text()


def test_the_recorded_schedules_are_their_summary_lines():
    """The whole schedules kept are the cases' own: their lines in summary.txt agree."""
    for case_id in FULL_SCHEDULES:
        assert summary_line(case_id, schedule_path(case_id).read_text()) == RECORDED[case_id]
    kept = {path.relative_to(SCHEDULES).with_suffix("") for path in SCHEDULES.rglob("*.json")}
    assert kept == {schedule_path(i).relative_to(SCHEDULES).with_suffix("") for i in FULL_SCHEDULES}


def test_the_cases_cover_every_bundled_profile_and_algorithm():
    """Two cases per algorithm of every family that fits each bundled profile; no stray line.

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
    assert list(RECORDED) == [case["id"] for case in EVERY_CASE]


def test_the_recorded_plans_hold_feasible_and_infeasible_ones():
    """The budgets are chosen so that both outcomes are compared (and errors are none)."""
    outcomes = [line.split()[1] for line in RECORDED.values()]
    assert "error:" not in outcomes
    assert outcomes.count("feasible") > len(outcomes) // 2
    assert outcomes.count("infeasible") > len(outcomes) // 10
