"""The torch-csv export: every action parses with torch's own grammar, and a real CPU run.

The real run spawns one process per rank (gloo, a free port, a timeout), executes an exported
plan with ``_PipelineScheduleRuntime._load_csv`` on a tiny MLP cut into chain stages, and checks
the gradients equal those of the same step without pipelining (the sum of the micro-batch losses):
a non-contiguous ``pipeline-ilp`` plan on 2 ranks and a ``pipedream`` plan on 3 ranks (the GPipe
CSV is checked through torch's parser only, to keep the file fast). The real runs are marked
slow (``make test-all``); ``make test`` parses every exported plan with torch's grammar.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import memplan
from memplan.export.torch_csv import torch_csv
from tests.torch.ranks import free_port, run_ranks

torch = pytest.importorskip("torch")

HERE = Path(__file__).parent


def chain(work: list[float], act: int = 1000) -> dict:
    return {
        "format": "memplan-profile/1",
        "model": "mlp",
        "batch_size": 4,
        "input_size": act,
        "stages": [
            {
                "name": f"s{k}",
                "forward_time": w / 2,
                "backward_time": w / 2,
                "output_size": act,
                "saved_size": act,
                "weight_size": 100,
            }
            for k, w in enumerate(work)
        ],
    }


def _plans():
    # (1, 2, 1) on 2 GPUs: the ILP puts stages 0 and 2 together (non-contiguous).
    ilp = memplan.solve(chain([1, 2, 1]), "pipeline-ilp", "1GB", gpus=2, time_limit=10)
    pd = memplan.solve(chain([1, 1, 1, 1]), "pipedream", "1GB", gpus=3)
    gp = memplan.solve(chain([1, 1, 1]), "gpipe", "1GB", gpus=2)
    return {"ilp": ilp, "pipedream": pd, "gpipe": gp}


@pytest.fixture(scope="module")
def plans():
    return _plans()


def test_actions_parse_with_torch_grammar(plans):
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    for sched in plans.values():
        text = torch_csv(sched, 4)
        rows = [line.split(",") for line in text.splitlines()]
        assert len(rows) == max(sched.assignment) + 1
        seen = set()
        for rank, row in enumerate(rows):
            for cell in row:
                action = _Action.from_str(cell)
                assert str(action) == cell  # round trip through torch's parser
                assert sched.assignment[action.stage_index] == rank
                assert action.computation_type in (
                    _ComputationType.FORWARD,
                    _ComputationType.FULL_BACKWARD,
                )
                seen.add(
                    (action.stage_index, action.computation_type.value, action.microbatch_index)
                )
        L = len(sched.assignment)
        assert seen == {(k, c, m) for k in range(L) for c in ("F", "B") for m in range(4)}


def test_ilp_plan_is_non_contiguous(plans):
    assert plans["ilp"].assignment in ([0, 1, 0], [1, 0, 1])


def _reference(count: int, micro: int):
    sys.path.insert(0, str(HERE))
    try:
        import pipeline_worker as worker
    finally:
        sys.path.pop(0)
    layers = worker.build_layers(count)
    model = torch.nn.Sequential(*layers)
    x, y = worker.data(micro)
    loss = sum(
        torch.nn.functional.mse_loss(model(xm), ym)
        for xm, ym in zip(x.chunk(micro), y.chunk(micro), strict=True)
    )
    loss.backward()
    return {
        f"{k}.{name}": p.grad.detach().clone()
        for k, layer in enumerate(layers)
        for name, p in layer.named_parameters()
    }


# Two or three processes importing torch.distributed (about 9 s of CPU each run): make test-all.
@pytest.mark.slow
@pytest.mark.parametrize("which", ["ilp", "pipedream"])
def test_real_run_matches_unpipelined_gradients(plans, which, tmp_path):
    sched = plans[which]
    micro = 4
    path = tmp_path / "plan.csv"
    path.write_text(torch_csv(sched, micro))
    world = max(sched.assignment) + 1
    count = len(sched.assignment)
    port = free_port()
    run_ranks(
        HERE / "pipeline_worker.py",
        world,
        lambda rank: [world, port, path, count, micro, tmp_path / f"grads{rank}.pt"],
        timeout=120,
    )
    got = {}
    for rank in range(world):
        got.update(torch.load(tmp_path / f"grads{rank}.pt"))
    want = _reference(count, micro)
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6)
