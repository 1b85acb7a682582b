"""Pipeline family (papers/001): the paper's worked examples, the simulator, brute force, bad input.

Every schedule that leaves ``memplan.solve`` has been replayed by the pipeline simulator (it raises
InternalError otherwise); the tests replay them once more with ``memplan.simulate`` and check the
claims, and break schedules on purpose to see the simulator reject them.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
from typer.testing import CliRunner

import memplan
from memplan.algorithms.pipeline.model import PipelineInstance
from memplan.algorithms.pipeline.pipedream import partition
from memplan.cli.app import app
from memplan.cli.common import REPORT_DECIMALS
from memplan.errors import InputError
from memplan.schedule import Schedule

ALGOS = ("pipeline-ilp", "pipedream", "gpipe")


def chain(work, weights=None, act=0, comm=None):
    """A profile with stage ``k`` of total time ``work[k]`` (half forward, half backward)."""
    weights = weights or [0] * len(work)
    return {
        "format": "memplan-profile/1",
        "model": "toy",
        "batch_size": 1,
        "input_size": act,
        "stages": [
            {
                "name": f"s{k}",
                "forward_time": w / 2,
                "backward_time": w / 2,
                "output_size": act,
                "saved_size": act,
                "weight_size": wt,
            }
            for k, (w, wt) in enumerate(zip(work, weights, strict=True))
        ],
    }


def replay_ok(prof, sched: Schedule) -> None:
    check = memplan.simulate(prof, sched)
    assert check.valid, check.violation
    assert check.makespan == pytest.approx(sched.makespan)
    assert check.peak_memory == sched.peak_memory
    assert check.peak_memory <= sched.budget.memory


# --------------------------------------------------------------------------- the paper's examples


def test_section_4_2_1_contiguous_3_general_2():
    """Chain (1, 2, 1) on 2 GPUs, memory no constraint: contiguous period 3, general period 2."""
    prof = chain([1, 2, 1])
    pd = memplan.solve(prof, "pipedream", "1GB", gpus=2)
    ilp = memplan.solve(prof, "pipeline-ilp", "1GB", gpus=2, time_limit=20)
    assert pd.period == pytest.approx(3.0)
    assert ilp.period == pytest.approx(2.0)
    assert ilp.solver.status == "optimal"
    assert ilp.assignment in ([0, 1, 0], [1, 0, 1])
    # brute force over every contiguous allocation: the bottleneck is at least 3
    work = [1, 2, 1]
    best = min(max(sum(work[:c]), sum(work[c:])) if 0 < c < 3 else sum(work) for c in range(0, 4))
    assert best == 3
    for sched in (pd, ilp):
        replay_ok(prof, sched)


def test_lemma_2_contiguous_infeasible_general_feasible():
    """Weights (1, 2, 1) on 2 GPUs of memory 2 (paper's units, activations 0).

    memplan keeps 3 weight-sized copies per weight byte with SGD (two versions + gradients, §6.2.3),
    so the paper's memory 2 becomes 3 x 2 = 6 bytes here.
    """
    prof = chain([1, 1, 1], weights=[1, 2, 1])
    memory = 3 * 2
    inst = PipelineInstance.from_profile(memplan.load_profile(prof), 2, None)
    for cut in (1, 2):  # every contiguous allocation on 2 GPUs puts layer 2 with another
        groups = [list(range(cut)), list(range(cut, 3))]
        assert max(inst.static_on(g) for g in groups) > memory
    assert inst.static_on([0, 1, 2]) > memory  # and one GPU cannot hold all
    pd = memplan.solve(prof, "pipedream", memory, gpus=2)
    assert not pd.feasible
    ilp = memplan.solve(prof, "pipeline-ilp", memory, gpus=2, time_limit=20)
    assert ilp.feasible
    assert ilp.assignment in ([0, 1, 0], [1, 0, 1])
    assert ilp.period == pytest.approx(2.0, rel=1e-3)
    replay_ok(prof, ilp)


# --------------------------------------------------------------------------- brute force


def _best_any_allocation(work, gpus):
    """Least period of any allocation, no memory and free transfers: the least max load."""
    return min(
        max(sum(w for w, g in zip(work, a, strict=True) if g == p) for p in range(gpus))
        for a in itertools.product(range(gpus), repeat=len(work))
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_ilp_matches_brute_force_without_memory_limit(seed):
    rng = random.Random(seed)
    work = [rng.randint(1, 6) for _ in range(4)]
    prof = chain(work)
    ilp = memplan.solve(prof, "pipeline-ilp", "1GB", gpus=2, time_limit=30)
    assert ilp.solver.status == "optimal"
    assert ilp.period == pytest.approx(_best_any_allocation(work, 2))
    replay_ok(prof, ilp)


@pytest.mark.parametrize("seed", range(5))
def test_pipedream_partition_is_the_best_contiguous_split(seed):
    rng = random.Random(seed)
    work = [rng.randint(1, 9) for _ in range(6)]
    inst = PipelineInstance.from_profile(memplan.load_profile(chain(work)), 3, None)
    assignment = partition(inst, 3)
    load = [sum(w for w, g in zip(work, assignment, strict=True) if g == p) for p in range(3)]
    best = min(
        max(sum(work[:a]), sum(work[a:b]), sum(work[b:]))
        for a in range(1, 6)
        for b in range(a + 1, 6)
    )
    assert max(load) == best


# --------------------------------------------------------------------------- every plan replays


@pytest.fixture(scope="module")
def resnet_plans():
    prof = memplan.load_profile("resnet18@a100")
    plans = {
        algo: memplan.solve(prof, algo, "3GB", gpus=4, link_bandwidth="25GB/s", time_limit=2)
        for algo in ALGOS
    }
    return prof, plans


def test_every_algorithm_replays_on_resnet18(resnet_plans):
    prof, plans = resnet_plans
    for sched in plans.values():
        assert sched.feasible
        replay_ok(prof, sched)
        assert sched.throughput == pytest.approx(
            prof.batch_size * sched.batches_per_period / sched.period * 1e3
        )
        assert max(sched.gpu_memory) == sched.peak_memory
    assert plans["pipeline-ilp"].period <= plans["pipedream"].period + 1e-9


def test_schedule_round_trips_through_json(resnet_plans):
    prof, plans = resnet_plans
    text = plans["pipeline-ilp"].to_json()
    again = memplan.load_schedule(json.loads(text))
    replay_ok(prof, again)


def _mutate(sched: Schedule, edit) -> Schedule:
    doc = sched.to_dict()
    edit(doc)
    return memplan.load_schedule(doc)


def test_simulator_rejects_broken_patterns(resnet_plans):
    prof, plans = resnet_plans
    sched = plans["pipedream"]

    def shorter_period(doc):
        doc["period"] = doc["makespan"] = doc["period"] * 0.5

    def wrong_gpu(doc):
        doc["assignment"][0] = (doc["assignment"][0] + 1) % 4

    def early_forward(doc):  # F 1 on a mini-batch F 0 has not produced yet
        for gp in doc["pattern"]:
            for op in gp["ops"]:
                if op["op"] == "F" and op["stage"] == 1:
                    op["shift"] -= 1

    def no_transfer(doc):
        doc["transfers"] = doc["transfers"][1:]

    for edit, words in (
        (shorter_period, ("overlap", "before", "more than the period")),
        (wrong_gpu, ("assigned",)),
        (early_forward, ("before",)),
        (no_transfer, ("appears 0 times",)),
    ):
        check = memplan.simulate(prof, _mutate(sched, edit), check_claims=False)
        assert not check.valid
        assert any(word in check.violation for word in words), check.violation
    over = memplan.simulate(prof, sched, memory=sched.peak_memory - 1)
    assert not over.valid and "budget" in over.violation


def test_simulator_memory_by_hand():
    """One GPU, two stages (stashes 10 + x[0] 5 and 100, g[1] 7 bytes, weights 1 each)."""
    prof = {
        "format": "memplan-profile/1",
        "model": "hand",
        "batch_size": 1,
        "input_size": 5,
        "stages": [
            {
                "name": "a",
                "forward_time": 1,
                "backward_time": 1,
                "output_size": 10,
                "saved_size": 10,
                "weight_size": 1,
                "grad_size": 7,
            },
            {
                "name": "b",
                "forward_time": 1,
                "backward_time": 1,
                "output_size": 100,
                "saved_size": 100,
                "weight_size": 1,
            },
        ],
    }
    sched = memplan.solve(prof, "pipedream", 10_000, gpus=1)
    # F0 [0,1) F1 [1,2) B1 [2,3) B0 [3,4): stash0 = 10 + x0 5, stash1 = 100,
    # g[1] (7 bytes, input of B0) from the start of B1 to the end of B0; static 3 x 2.
    assert sched.period == pytest.approx(4.0)
    assert sched.peak_memory == 6 + 15 + 100 + 7


# --------------------------------------------------------------------------- bad input


def test_gpus_missing_or_bad_is_an_input_error():
    prof = chain([1, 1])
    with pytest.raises(InputError, match="^gpus"):
        memplan.solve(prof, "pipedream", "1GB")
    with pytest.raises(InputError, match="^gpus"):
        memplan.solve(prof, "pipeline-ilp", "1GB", gpus=0)


def test_memory_below_any_allocation_is_infeasible_with_reason():
    prof = chain([1, 1], weights=[100, 100])
    for algo in ALGOS:
        sched = memplan.solve(prof, algo, 50, gpus=2, time_limit=5)
        assert not sched.feasible
        assert sched.solver.message


def test_more_gpus_than_stages_uses_at_most_one_per_stage():
    prof = chain([1, 2, 1])
    for algo in ALGOS:
        sched = memplan.solve(prof, algo, "1GB", gpus=5, time_limit=10)
        assert sched.feasible
        assert len(set(sched.assignment)) <= 3
        replay_ok(prof, sched)


runner = CliRunner()


def test_cli_exit_codes(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text(json.dumps(chain([1, 2, 1])))
    missing = runner.invoke(app, ["solve", str(path), "--algo", "pipedream", "--mem", "1GB"])
    assert missing.exit_code == 2
    assert "--gpus" in missing.output and "Traceback" not in missing.output
    bad_rate = runner.invoke(
        app,
        [
            "solve",
            str(path),
            "--algo",
            "pipedream",
            "--mem",
            "1GB",
            "--gpus",
            "2",
            "--link-bandwidth",
            "8G",
        ],
    )
    assert bad_rate.exit_code == 2
    heavy = tmp_path / "heavy.yaml"
    heavy.write_text(json.dumps(chain([1, 1], weights=[100, 100])))
    infeasible = runner.invoke(
        app, ["solve", str(heavy), "--algo", "pipedream", "--mem", "50", "--gpus", "2"]
    )
    assert infeasible.exit_code == 1
    assert "infeasible" in infeasible.output
    ok = runner.invoke(
        app,
        [
            "solve",
            str(path),
            "--algo",
            "pipedream",
            "--mem",
            "1GB",
            "--gpus",
            "2",
            "--format",
            "json",
            "--link-bandwidth",
            "1GB/s",
        ],
    )
    assert ok.exit_code == 0, ok.output
    plan = tmp_path / "plan.json"
    plan.write_text(ok.stdout)
    sim = runner.invoke(app, ["simulate", str(path), str(plan)])
    assert sim.exit_code == 0, sim.output
    csv = runner.invoke(
        app,
        [
            "solve",
            str(path),
            "--algo",
            "pipedream",
            "--mem",
            "1GB",
            "--gpus",
            "2",
            "--format",
            "torch-csv",
            "--micro-batches",
            "3",
        ],
    )
    assert csv.exit_code == 0, csv.output
    rows = csv.stdout.strip().splitlines()
    assert len(rows) == 2 and all("F" in row for row in rows)


def _random_chain(rng: random.Random, length: int) -> dict:
    stages = []
    for k in range(length):
        out = rng.randint(1, 20) * 1000
        stages.append(
            {
                "name": f"s{k}",
                "forward_time": rng.randint(1, 4) / 2,
                "backward_time": rng.randint(1, 6) / 2,
                "output_size": out,
                "saved_size": out + rng.randint(0, 30) * 1000,
                "forward_overhead": rng.randint(0, 5) * 1000,
                "backward_overhead": rng.randint(0, 5) * 1000,
                "weight_size": rng.randint(0, 10) * 1000,
            }
        )
    return {
        "format": "memplan-profile/1",
        "model": "random",
        "batch_size": 2,
        "input_size": rng.randint(1, 20) * 1000,
        "stages": stages,
    }


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_ilp_memory_model_is_conservative(seed):
    """Every plan CP-SAT finds replays within the budget (Lemma 10 + reserved buffers)."""
    from memplan.algorithms.pipeline.ilp import solve_ilp

    rng = random.Random(seed)
    prof = memplan.load_profile(_random_chain(rng, 4))
    inst = PipelineInstance.from_profile(prof, 2, 4e6, "sgd")  # 4 MB/s: transfers matter
    free = memplan.solve(prof, "pipeline-ilp", 10**9, gpus=2, link_bandwidth=4e6, time_limit=5)
    for share in (0.12, 0.2, 0.4):  # 0.12 binds (longer periods) on these seeds
        memory = int(free.peak_memory * share)
        out = solve_ilp(prof, inst, memory, 4)
        if out.status in ("optimal", "feasible"):
            assert out.ilp_plan is not None  # replayed by the simulator within the budget
            assert max(out.ilp_peaks) <= memory


def test_compare_sweeps_pipeline_algorithms_per_gpu_budget():
    """``compare --gpus``: every row a plan the simulator accepted at that per-GPU budget; the
    same figures as ``solve`` at that budget; without --gpus, one clear line (exit 2)."""
    args = ["compare", "resnet18@a100", "--algos", "pipedream,gpipe", "--mem", "3GB:6GB:2"]
    result = runner.invoke(app, [*args, "--gpus", "4", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert {r["algorithm"] for r in rows} == {"pipedream", "gpipe"} and len(rows) == 4
    for row in rows:
        sched = memplan.solve("resnet18@a100", row["algorithm"], row["memory"], gpus=4)
        assert row["feasible"] == sched.feasible
        assert row["makespan"] == round(sched.makespan, REPORT_DECIMALS)  # a report: rounded
    missing = runner.invoke(app, args)
    assert missing.exit_code == 2 and "--gpus" in missing.stderr
