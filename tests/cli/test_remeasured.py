"""`memplan simulate` against a profile measured again: times are a note, memory is the verdict.

Issue 40 item 1: a CI job that runs `memplan profile ... > p.yaml && memplan simulate p.yaml
plan.json` failed whenever the machine was a little slower, while every size was the same.
NOTE [ re-measured profiles ] in memplan/simulator/retime.py; SPEC.md's exit codes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import memplan
from memplan.cli.app import app
from memplan.profile.model import Profile, Stage
from memplan.profile.synthetic import random_chain, random_join
from memplan.simulator.retime import timed_as_schedule

runner = CliRunner()


def _slower(stage: Stage, k: int) -> Stage:
    """The stage measured again: forward 10% slower, backward 5% faster, every 3rd one as it was."""
    if k % 3 == 2:
        return stage
    return stage.model_copy(
        update={
            "forward_time": stage.forward_time * 1.1 + 0.5,
            "backward_time": stage.backward_time * 0.95,
        }
    )


def remeasured(prof: Profile) -> Profile:
    """``prof`` with other times and the same sizes (what profiling again on a busy machine gives)."""
    if prof.stages is not None:
        return prof.model_copy(
            update={"stages": [_slower(s, k) for k, s in enumerate(prof.stages)]}
        )
    if prof.branches is not None and prof.turn is not None:
        branches = [
            b.model_copy(update={"stages": [_slower(s, k) for k, s in enumerate(b.stages)]})
            for b in prof.branches
        ]
        return prof.model_copy(update={"branches": branches, "turn": _slower(prof.turn, 0)})
    assert prof.graph is not None
    nodes = [n.model_copy(update={"time": n.time + 1.0}) for n in prof.graph.nodes]
    return prof.model_copy(update={"graph": prof.graph.model_copy(update={"nodes": nodes})})


CHAIN = random_chain(6, seed=3, max_size=1000)
CASES: dict[str, tuple[Any, str, int | str, dict[str, Any]]] = {
    "chain rotor": (CHAIN, "rotor", 12_000, {}),
    "offload dynprog": (CHAIN, "dynprog", 12_858, {"bandwidth": "100KB/s"}),
    "combined pofo": (CHAIN, "pofo", 12_858, {"bandwidth": "100KB/s"}),
    "pipeline gpipe": (CHAIN, "gpipe", 12_858, {"gpus": 2}),
    "join": (random_join([3, 2], seed=1, max_size=100), "join", 10**6, {}),
    "graph": ("alexnet-graph-b1", "greedy-by-size", "10GB", {}),
}


def _files(tmp_path: Path, case: str) -> tuple[Path, Path, Path, Any]:
    """The profile a plan was made on, the plan, and the profile measured again."""
    source, algo, memory, options = CASES[case]
    prof = memplan.load_profile(source)
    schedule = memplan.solve(prof, algo, memory, **options)
    assert schedule.feasible, case
    first, plan, again = tmp_path / "p.yaml", tmp_path / "plan.json", tmp_path / "p2.yaml"
    memplan.save_profile(prof, first)
    plan.write_text(schedule.to_json())
    memplan.save_profile(remeasured(prof), again)
    return first, plan, again, schedule


def _lines(result: Any) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_times_that_differ_are_a_note_and_exit_0(tmp_path, case):
    first, plan, again, _ = _files(tmp_path, case)
    assert runner.invoke(app, ["simulate", str(first), str(plan)]).exit_code == 0
    result = runner.invoke(app, ["simulate", str(again), str(plan)])
    assert result.exit_code == 0, result.stderr
    last = _lines(result)[-1]
    assert last.startswith("memplan: note: the profile's times differ from the schedule's"), last
    assert "valid and fits the budget" in last and "--strict" not in last
    assert "INVALID" not in result.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_strict_keeps_the_strict_check(tmp_path, case):
    _, plan, again, _ = _files(tmp_path, case)
    result = runner.invoke(app, ["simulate", str(again), str(plan), "--strict"])
    assert result.exit_code == 1, result.stderr
    lines = _lines(result)
    assert lines[-1].startswith("memplan: invalid: "), lines[-1]
    assert lines[-2].startswith("memplan: note: ") and "--strict" in lines[-2]


def test_json_says_how_the_times_differ(tmp_path):
    _, plan, again, schedule = _files(tmp_path, "chain rotor")
    result = runner.invoke(app, ["simulate", str(again), str(plan), "-f", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["valid"] and doc["fits"] and doc["violation"] is None
    assert doc["times_match"] is False and "differ" in doc["time_note"]
    # replayed with the schedule's times: the schedule's own figures
    assert doc["makespan"] == pytest.approx(schedule.makespan)
    assert doc["peak_memory"] == schedule.peak_memory
    strict = json.loads(
        runner.invoke(app, ["simulate", str(again), str(plan), "-f", "json", "--strict"]).stdout
    )
    assert strict["valid"] is False and strict["violation"].startswith("ops[0]")
    same = runner.invoke(app, ["simulate", str(tmp_path / "p.yaml"), str(plan), "-f", "json"])
    assert json.loads(same.stdout)["times_match"] is True


def test_a_memory_violation_still_exits_1_naming_the_operation(tmp_path):
    """Times differ and the budget is too small: the violation is the memory one (the first
    operation over the budget, replayed with the schedule's times), not the first timing."""
    _, plan, again, schedule = _files(tmp_path, "chain rotor")
    budget = str(schedule.peak_memory - 1)
    result = runner.invoke(app, ["simulate", str(again), str(plan), "--mem", budget])
    assert result.exit_code == 1
    lines = _lines(result)
    assert lines[-1].startswith("memplan: invalid: ops[") and "needs" in lines[-1], lines[-1]
    assert "still fails" in lines[-2]


def test_sizes_that_differ_are_not_relaxed(tmp_path):
    """A profile whose sizes differ is another profile: the claims decide (exit 1)."""
    _, plan, again, _ = _files(tmp_path, "chain rotor")
    prof = memplan.load_profile(again)
    stages = list(prof.chain_stages)
    stages[2] = stages[2].model_copy(update={"saved_size": stages[2].saved_size + 500})
    memplan.save_profile(prof.model_copy(update={"stages": stages}), again)
    result = runner.invoke(app, ["simulate", str(again), str(plan)])
    assert result.exit_code == 1, result.stderr
    assert _lines(result)[-1].startswith("memplan: invalid: ")


def test_a_schedule_whose_own_times_disagree_gets_the_strict_verdict(tmp_path):
    """Two runs of one stage's forward that last differently: no profile is timed like that."""
    first, plan, _, _ = _files(tmp_path, "chain rotor")
    doc = json.loads(plan.read_text())
    forwards = [
        k for k, op in enumerate(doc["ops"]) if op["op"].startswith("F") and op["stage"] == 0
    ]
    assert len(forwards) >= 2, "the plan recomputes stage 0"
    shift = 0.25
    for op in doc["ops"][forwards[1] :]:  # the second forward of stage 0 lasts longer
        op["end"] += shift
        op["start"] += shift if op is not doc["ops"][forwards[1]] else 0.0
    plan.write_text(json.dumps(doc))
    schedule = memplan.load_schedule(plan)
    assert timed_as_schedule(memplan.load_profile(first), schedule) is None
    result = runner.invoke(app, ["simulate", str(first), str(plan), "-f", "json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["times_match"] is None


def test_the_retimed_profile_keeps_every_size():
    prof = remeasured(CHAIN)
    schedule = memplan.solve(CHAIN, "rotor", 12_000)
    retimed = timed_as_schedule(prof, schedule)
    assert retimed is not None
    for old, new in zip(CHAIN.chain_stages, retimed.profile.chain_stages, strict=True):
        assert new.model_dump(exclude={"forward_time", "backward_time"}) == old.model_dump(
            exclude={"forward_time", "backward_time"}
        )
        assert new.forward_time == pytest.approx(old.forward_time)  # the schedule's times
    assert memplan.simulate(retimed.profile, schedule).valid
    assert retimed.profile_ms > retimed.schedule_ms > 0
