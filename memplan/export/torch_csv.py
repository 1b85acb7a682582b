"""A pipeline plan as a ``torch.distributed.pipelining`` schedule CSV (compute-only actions).

NOTE [ torch-csv export ]
One row per rank (GPU ``0 .. max(assignment)``), each cell an action ``{stage}F{mb}`` or
``{stage}B{mb}`` (torch's ``_Action`` grammar: stage index, computation type, micro-batch), in the
order the rank runs them. Torch's pipeline stage ``k`` is memplan's chain stage ``k``, so a rank
may hold several (non-contiguous) stages: torch infers the stage-to-rank map from the file.
The order is that of the periodic pattern unrolled over mini-batches ``0 .. M-1`` (one torch
micro-batch per memplan mini-batch): operation with shift ``s`` works on mini-batch ``m`` in copy
``i = (m + s) / r`` at ``start + i * period``; a rank's actions are sorted by that time. The warm-up
and drain of the ``M`` mini-batches are what the unrolled pattern leaves of them.

Run it with ``_PipelineScheduleRuntime`` (``_load_csv(path, format="compute_only")`` lowers it
with the sends and receives): ``PipelineScheduleMulti`` accepts the same file but pairs sends
and receives in lock-step and can silently compute wrong gradients on such schedules
(docs/pipeline.md).
"""

from __future__ import annotations

from typing import Any

from memplan.errors import InputError

MAX_MICRO_BATCHES = 10_000
"""The most micro-batches of one exported step (each GPU's line has two actions per stage and
micro-batch: 10^8 of them took 4.4 GB and more than a minute)."""


def unrolled_actions(schedule: Any, micro_batches: int) -> dict[int, list[tuple[float, str]]]:
    """Rank -> [(time, action)] for mini-batches ``0 .. micro_batches-1``, in time order."""
    if schedule.family != "pipeline" or not schedule.feasible or schedule.pattern is None:
        raise InputError(
            "--format torch-csv: needs a feasible pipeline schedule (--algo pipeline-ilp, pipedream or gpipe)"
        )
    if not 1 <= micro_batches <= MAX_MICRO_BATCHES:
        raise InputError(
            f"--micro-batches {micro_batches}: expected an integer from 1 to {MAX_MICRO_BATCHES}"
        )
    r = schedule.batches_per_period or 1
    period = schedule.period
    ranks = max(schedule.assignment) + 1
    rows: dict[int, list[tuple[float, int, str]]] = {g: [] for g in range(ranks)}
    for gp in schedule.pattern:
        for op in gp.ops:
            for m in range(micro_batches):
                if (m + op.shift) % r:
                    continue
                copy = (m + op.shift) // r
                t = op.start + copy * period
                # ties: forward before backward, then by stage order of the chain
                rows[gp.gpu].append((t, 0 if op.op == "F" else 1, f"{op.stage}{op.op}{m}"))
    return {
        g: [(t, a) for t, _, a in sorted(items, key=lambda e: (round(e[0], 9), e[1]))]
        for g, items in rows.items()
    }


def torch_csv(schedule: Any, micro_batches: int) -> str:
    """The CSV text: one line per rank, comma-separated actions."""
    rows = unrolled_actions(schedule, micro_batches)
    return "".join(",".join(a for _, a in rows[g]) + "\n" for g in sorted(rows))
