"""One rank of a torch.distributed.pipelining run of a memplan torch-csv plan (CPU, gloo).

Run by tests/torch/test_pipeline.py as ``python tests/torch/pipeline_worker.py RANK WORLD PORT CSV
LAYERS MICRO OUT``; this is also the recipe of docs/pipeline.md: every chain stage ``k`` becomes
a ``PipelineStage(stage_index=k)`` on the rank the CSV puts it on, and
``_PipelineScheduleRuntime._load_csv`` runs the plan.
"""

from __future__ import annotations

import csv
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

WIDTH = 8
BATCH = 4


def build_layers(count: int) -> list[nn.Module]:
    """The tiny MLP of the test, one module per chain stage (same seed on every rank)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for k in range(count):
        if k == count - 1:
            layers.append(nn.Linear(WIDTH, 1))
        else:
            layers.append(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()))
    return layers


def data(micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(micro * BATCH, WIDTH, generator=gen)
    y = torch.randn(micro * BATCH, 1, generator=gen)
    return x, y


def stages_of(csv_path: str, rank: int) -> list[int]:
    """The stages a rank runs, read from its row of the CSV (``{stage}F{mb}`` actions)."""
    with open(csv_path, newline="") as handle:
        rows = list(csv.reader(handle))
    found = sorted({int(a.split("F")[0]) for a in rows[rank] if "F" in a})
    return found


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    csv_path, count, micro, out = sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    layers = build_layers(count)
    mine = stages_of(csv_path, rank)
    device = torch.device("cpu")
    stages = [PipelineStage(layers[k], k, count, device) for k in mine]
    schedule = _PipelineScheduleRuntime(
        stages, n_microbatches=micro, loss_fn=nn.functional.mse_loss, scale_grads=False
    )
    schedule._load_csv(csv_path, format="compute_only")
    x, y = data(micro)
    args = (x,) if 0 in mine else ()
    target = y if count - 1 in mine else None
    schedule.step(*args, target=target)
    grads = {
        f"{k}.{name}": p.grad.detach().clone()
        for k in mine
        for name, p in layers[k].named_parameters()
    }
    torch.save(grads, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
