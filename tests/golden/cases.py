"""The golden cases: which (profile, algorithm, budget, options) and how each is recorded.

NOTE [ golden schedules ]
Every bundled profile is solved by every algorithm of every family that fits it, at two budgets
chosen from ``memplan.api.describe`` so that both feasible plans and infeasible ones (with their
``min_memory``) appear; the second budget of each pair also passes explicit options (``slots``,
``bandwidth`` as text, ``optimizer``, ``gpus``, ``link_bandwidth``, ``time_limit``) so that the
options' path from the caller to the solver is covered as well as the defaults. A case's output is
``Schedule.to_json()`` with ``solver.seconds`` replaced by ``"stripped"`` (a timing), or
``error: MESSAGE`` when ``memplan.solve`` raises ``InputError``.

What is kept of it (``summary.txt``, one line per case, :func:`summary_line`): the outcome, the
makespan, the peak and least memory, the solver's status, and two digests, of the plan (``ops``,
``order``, ``addresses``: ``plan=STEPS:DIGEST``) and of every other field (``rest=DIGEST``): a case
still compares all of its output, and a deliberate change of plans shows as a few changed lines
that say what changed. The full JSON of a handful of small cases (``FULL_SCHEDULES``, one per
family and kind of solver) is kept too, under ``schedules/``, and compared byte for byte.

CP-SAT algorithms (``CPSAT_ALGORITHMS``) stop on a wall-clock limit, so their plans depend on the
machine. For the golden plans every CP-SAT solve runs with one worker, a fixed seed and a
*deterministic* limit of ``DETERMINISTIC_SECONDS`` (CP-SAT's own work counter) instead of the wall
clock (:func:`deterministic_cpsat`, applied by the generator and by the test alike): the model,
the hints, the reading of the solution and the wrapping into a schedule are all compared; what is
not compared is how far CP-SAT gets within the user's wall-clock limit. Those plans hold for
the OR-Tools version recorded in cases.json only (requirements/test.txt pins it).

Solving all 896 cases takes minutes (CP-SAT, pofo and the pipeline DPs on the long chains, the
graph profiles' YAML), so ``make test`` compares a fixed selection (:func:`heavy`): the cheap
algorithms on every profile and every algorithm on representative profiles of each kind; the
heavy cases are marked slow (``make test-all`` and ``make golden`` compare them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
MANIFEST = HERE / "cases.json"
SUMMARY = HERE / "summary.txt"
SCHEDULES = HERE / "schedules"

FULL_SCHEDULES = (
    "resnet18/rotor/0",
    "resnet18/dynprog/1",
    "resnet18/pofo/0",
    "resnet18/gpipe/1",
    "resnet18/pipeline-ilp/0",
    "cross-modal-resnet18/join/0",
    "siamese-resnet18/equiv-chain/0",
    "alexnet-graph-b1/olla/0",
)
"""Cases whose whole JSON is kept (``schedules/``): a small one of every family (chain, offload,
combined, pipeline, join, graph), a DP and a CP-SAT solver among them."""

CPSAT_ALGORITHMS = frozenset({"olla", "olla-order", "olla-address", "pipeline-ilp"})
DETERMINISTIC_SECONDS = 0.2
"""CP-SAT's deterministic time limit of every solve of a golden case (see the NOTE)."""

SMALL_PROFILES = frozenset({"resnet18", "alexnet-graph-b1"})
"""Where the CP-SAT algorithms run on every ``make test`` (the smallest of their kinds)."""
REPRESENTATIVE = frozenset(
    {
        "resnet18",
        "gpt-small",
        "resnet18@a100",
        "vgg16@a100",
        "cross-modal-resnet18",
        "siamese-resnet18",
        "alexnet-graph-b1",
    }
)
"""Profiles of every kind and source (measured, estimated, join, graph) on which every other
algorithm runs on every ``make test``."""
CHEAP = frozenset({"store-all", "periodic", "revolve", "rotor", "greedy", "vdnn"})
"""Algorithms compared on every profile on every ``make test`` (milliseconds a case; dynprog
takes a second on the longest chains, so it runs on the representative profiles)."""

MB = 10**6


def _mb(value: float) -> int:
    """Round a budget to whole megabytes (10^6 bytes), so the cases read well."""
    return max(MB, round(value / MB) * MB)


def _between(low: int, high: int, share: float) -> int:
    return _mb(low + (high - low) * share)


def cases_for(name: str) -> list[dict[str, Any]]:
    """The golden cases of one bundled profile: two per algorithm of every family that fits."""
    import memplan
    from memplan.api import describe

    prof = memplan.load_profile(name)
    sgd, adam = describe(prof, "sgd"), describe(prof, "adam")
    found: list[dict[str, Any]] = []
    for entry in memplan.list_algorithms():
        algo, family = entry["name"], entry["family"]
        if family not in prof.families:
            continue
        for index, (memory, options) in enumerate(_budgets(prof, family, algo, sgd, adam)):
            found.append(
                {
                    "id": f"{name}/{algo}/{index}",
                    "profile": name,
                    "algo": algo,
                    "family": family,
                    "memory": memory,
                    "options": options,
                }
            )
    return found


def _budgets(
    prof: Any, family: str, algo: str, sgd: dict[str, Any], adam: dict[str, Any]
) -> list[tuple[int, dict[str, Any]]]:
    """Two (budget, options) pairs; the second passes explicit options."""
    if family in ("chain", "offload", "combined"):
        first: dict[str, Any] = {}
        second: dict[str, Any] = {"optimizer": "adam", "slots": 40 if algo == "pofo" else 300}
        if family != "chain":
            if prof.bandwidth is None:
                first["bandwidth"] = 12e9
            second["bandwidth"] = "16GiB/s"
        tight = _between(sgd["min_memory"]["chain"], sgd["store_all_memory"], 0.15)
        roomy = _between(adam["min_memory"]["chain"], adam["store_all_memory"], 0.6)
        return [(tight, first), (roomy, second)]
    if family == "join":
        tight = _between(sgd["min_memory"]["join"], sgd["store_all_memory"], 0.15)
        roomy = _between(adam["min_memory"]["join"], adam["store_all_memory"], 0.6)
        return [(tight, {}), (roomy, {"optimizer": "adam", "slots": 200})]
    if family == "graph":
        arena = sgd["store_all_memory"]
        return [
            (_mb(arena * 0.95), {}),
            (_mb(arena * 1.05), {"optimizer": "none", "time_limit": 5.0}),
        ]
    if family == "pipeline":
        second = {"gpus": 2, "link_bandwidth": "25GB/s", "optimizer": "adam", "time_limit": 5.0}
        roomy = _mb(adam["store_all_memory"] / 2)
        if algo == "pipeline-ilp":  # below the heaviest stage's weights: answered at once
            return [(MB, {"gpus": 4}), (roomy, second)]
        return [(_mb(sgd["store_all_memory"] / 4), {"gpus": 4}), (roomy, second)]
    raise AssertionError(f"no golden budgets for the {family} family")


def all_cases() -> list[dict[str, Any]]:
    from memplan.profile import bundled_profiles

    return [case for name in sorted(bundled_profiles()) for case in cases_for(name)]


def heavy(case: dict[str, Any]) -> bool:
    """Cases compared only by ``make test-all`` and ``make golden`` (marked slow; see the NOTE).

    ``make test`` compares the cheap algorithms on every profile, every algorithm on the
    representative profiles (CP-SAT on the smallest ones, not the heterogeneous join of
    siamese-resnet18), and pipeline-ilp's first case (below the weights, answered at once)
    everywhere; pipeline-ilp's second cases only there (their phases stop on the wall clock).
    """
    profile, algo = case["profile"], case["algo"]
    if algo == "pipeline-ilp":
        # answered at once below the weights; otherwise its phases share the caller's wall-clock
        # limit (time.perf_counter), which a loaded machine can exhaust before CP-SAT has run
        return case["memory"] != MB
    if algo in CPSAT_ALGORITHMS:
        return profile not in SMALL_PROFILES
    if algo == "join" and profile == "siamese-resnet18":
        return True
    return algo not in CHEAP and profile not in REPRESENTATIVE


def schedule_path(case_id: str) -> Path:
    """Where the whole JSON of a case of ``FULL_SCHEDULES`` is kept."""
    profile, algo, index = case_id.split("/")
    return SCHEDULES / profile / f"{algo}-{index}.json"


PLAN_FIELDS = ("ops", "order", "addresses")
"""The fields of a schedule that hold the plan itself (chain-model families: ``ops``; graph:
``order`` and ``addresses``)."""

SUMMARY_HEADER = """\
# The golden plans: one line per case of cases.json, as memplan.solve answers it today
# (python -m tests.golden.regenerate rewrites this file; NOTE [ golden schedules ] in cases.py).
# case | outcome | makespan (ms) | peak and least memory (bytes) | solver status
#      | plan=STEPS:DIGEST of ops/order/addresses | rest=DIGEST of every other field
"""


def _digest(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _shown(value: Any) -> str:
    return "-" if value is None else json.dumps(value)


def summary_line(case_id: str, text: str) -> str:
    """The line of ``summary.txt`` for a case whose output (:func:`render`) is ``text``."""
    if text.startswith("error:"):
        return f"{case_id:<38} {text.strip()}"
    doc = json.loads(text)
    plan = {field: doc.pop(field) for field in PLAN_FIELDS if field in doc}
    steps = len(plan.get("ops") or plan.get("order") or [])
    outcome = "feasible" if doc["feasible"] else "infeasible"
    return (
        f"{case_id:<38} {outcome:<10} makespan={_shown(doc['makespan']):<18} "
        f"peak={_shown(doc['peak_memory']):<12} least={_shown(doc['min_memory']):<12} "
        f"{doc['solver']['status']:<10} plan={steps}:{_digest(plan)} rest={_digest(doc)}"
    )


def read_summary() -> dict[str, str]:
    """The recorded lines of ``summary.txt`` by case id."""
    lines = [line for line in SUMMARY.read_text().splitlines() if not line.startswith("#")]
    return {line.split(maxsplit=1)[0]: line for line in lines}


def write_summary(lines: dict[str, str], order: list[str]) -> None:
    SUMMARY.write_text(SUMMARY_HEADER + "".join(lines[case_id] + "\n" for case_id in order))


_SECONDS = re.compile(r'^(\s*"seconds": )[^,\n]*(,?)$', re.MULTILINE)


def strip_seconds(text: str) -> str:
    """The schedule's JSON with ``solver.seconds`` (a timing) replaced by ``"stripped"``."""
    stripped, count = _SECONDS.subn(r'\1"stripped"\2', text)
    if count != 1:
        raise AssertionError(f"expected one seconds field, found {count}")
    return stripped


def render(case: dict[str, Any], profile: Any = None) -> str:
    """What ``memplan.solve`` gives for the case: the schedule's JSON, or ``error: ...``.

    ``profile`` is the case's profile already loaded (None: load it by name), so that a caller
    solving many cases of one profile reads its YAML once.
    """
    import memplan

    source = case["profile"] if profile is None else profile
    try:
        sched = memplan.solve(source, case["algo"], case["memory"], **case["options"])
    except memplan.InputError as exc:
        return f"error: {exc}\n"
    return strip_seconds(sched.to_json()) + "\n"


@contextlib.contextmanager
def deterministic_cpsat() -> Iterator[None]:
    """Every CP-SAT solve in the block: one worker, seed 0, a deterministic time limit.

    The wall-clock limit the solver code sets is raised to an hour so that only the
    deterministic limit (``DETERMINISTIC_SECONDS``) stops the search (NOTE [ golden schedules ]).
    """
    from ortools.sat.python import cp_model

    original = cp_model.CpSolver.solve

    def solve(self: Any, model: Any, solution_callback: Any = None) -> Any:
        self.parameters.num_workers = 1
        self.parameters.random_seed = 0
        self.parameters.max_time_in_seconds = 3600.0
        self.parameters.max_deterministic_time = DETERMINISTIC_SECONDS
        return original(self, model, solution_callback)

    cp_model.CpSolver.solve = solve
    try:
        yield
    finally:
        cp_model.CpSolver.solve = original


def ortools_version() -> str:
    import ortools

    return ortools.__version__


def load_manifest() -> dict[str, Any]:
    return json.loads(MANIFEST.read_text())
