"""Write a schedule as Chrome trace-event JSON (open it in https://ui.perfetto.dev or chrome://tracing).

The document is ``{"traceEvents": [...], "displayTimeUnit": "ms"}`` with

* one complete event (``"ph": "X"``, ``ts``/``dur`` in microseconds) per operation, named
  ``"F_all layer1.0"`` / ``"offload s[3] layer2.0"``, on one track (``tid``) per stream:
  ``1`` compute, ``2`` transfer;
* a counter track (``"ph": "C"``, name ``memory``, ``args: {"bytes": ...}``) from the simulator's
  ``memory_curve`` (static memory included), and the budget as a second series when known;
* metadata events (``"ph": "M"``) naming the process and the threads;
* pipeline schedules: the first periods of the pattern (from mini-batch 0: the fill), one track per GPU (``GPU g``, tid ``10 + g``)
  and one per link (``link a-b``), each operation named with its mini-batch (``F conv1 #3``).

Specification: "Trace Event Format" (Google), the JSON Object Format.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from memplan.files import write_atomic
from memplan.profile.model import Profile
from memplan.schedule import Schedule, Stream

__all__ = ["STREAM_TIDS", "trace_events", "trace_document", "write_trace"]

STREAM_TIDS: dict[Stream, int] = {"compute": 1, "transfer": 2}
"""Thread id of each stream's track."""

_PID = 1


def _us(ms: float) -> float:
    return round(ms * 1000.0, 3)


def op_label(op: Any, names: Sequence[str]) -> str:
    """``F_all layer1.0``; transfers name their tensor: ``offload s[3] layer2.0``."""
    stage = names[op.stage] if 0 <= op.stage < len(names) else str(op.stage)
    if getattr(op, "branch", None) is not None:  # join schedules: branch j, stage within it
        stage = f"branch {op.branch} stage {op.stage}"
    if op.op in ("offload", "prefetch"):
        return f"{op.op} {op.tensor or f's[{op.stage}]'} {stage}"
    return f"{op.op} {stage}"


def trace_events(
    schedule: Schedule,
    profile: Profile | None = None,
    memory_curve: Sequence[tuple[float, int]] | None = None,
) -> list[dict[str, Any]]:
    """The trace events of a schedule.

    Parameters
    ----------
    schedule : Schedule
        A feasible schedule (an infeasible one gives only the metadata events).
    profile : Profile, optional
        Gives the stage names (else stages are numbered).
    memory_curve : sequence of (ms, bytes), optional
        ``memplan.simulate(profile, schedule).memory_curve``: the memory counter track.

    Returns
    -------
    list of dict
        Metadata (``M``), complete (``X``) and counter (``C``) events.
    """
    names = [s.name for s in profile.stages] if profile is not None and profile.stages else []
    title = f"memplan {schedule.algorithm}: {schedule.profile.model}"
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "tid": 0, "args": {"name": title}}
    ]
    streams = sorted({op.stream for op in schedule.ops}, key=STREAM_TIDS.__getitem__)
    if not schedule.pattern:  # every family but the pipelines has a compute track
        streams = sorted(set(streams) | {"compute"}, key=STREAM_TIDS.__getitem__)
    for stream in streams:
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": _PID,
                "tid": STREAM_TIDS[stream],
                "args": {"name": stream},
            }
        )
    for index, op in enumerate(schedule.ops):
        args: dict[str, Any] = {"index": index, "op": op.op, "stage": op.stage}
        if op.tensor is not None:
            args["tensor"] = op.tensor
        events.append(
            {
                "name": op_label(op, names),
                "cat": op.op,
                "ph": "X",
                "ts": _us(op.start),
                "dur": _us(max(0.0, op.end - op.start)),
                "pid": _PID,
                "tid": STREAM_TIDS[op.stream],
                "args": args,
            }
        )
    if schedule.order is not None:  # graph family: one event per node of the order
        events += _graph_events(schedule, profile)
    if schedule.pattern:  # pipeline family: one track per GPU and per link
        events += _pipeline_events(schedule, names)
    budget = schedule.budget.memory
    for time_ms, nbytes in memory_curve or ():
        values: dict[str, Any] = {"bytes": int(nbytes)}
        if budget is not None:
            values["budget"] = int(budget)
        events.append(
            {"name": "memory", "ph": "C", "ts": _us(time_ms), "pid": _PID, "args": values}
        )
    return events


def _graph_events(schedule: Schedule, profile: Profile | None) -> list[dict[str, Any]]:
    """Graph schedules: the nodes back to back on the compute track (1 ms per node when the
    graph has no times, as the graph simulator's memory curve).
    """
    nodes = {n.name: n for n in profile.graph.nodes} if profile and profile.graph else {}
    times = [nodes[name].time if name in nodes else 0.0 for name in schedule.order or []]
    if not any(times):
        times = [1.0] * len(times)
    events, clock = [], 0.0
    for index, (name, duration) in enumerate(zip(schedule.order or [], times, strict=True)):
        node = nodes.get(name)
        events.append(
            {
                "name": name,
                "cat": node.kind if node else "node",
                "ph": "X",
                "ts": _us(clock),
                "dur": _us(duration),
                "pid": _PID,
                "tid": STREAM_TIDS["compute"],
                "args": {"index": index, "op": node.op if node else "?"},
            }
        )
        clock += duration
    return events


PIPELINE_PERIODS = 4
"""Copies of a pipeline pattern a trace shows after the fill (which lasts the largest shift)."""
GPU_TID_BASE = 10
"""Pipeline traces: GPU ``g`` is track ``GPU_TID_BASE + g``; links follow the GPUs."""


def _pipeline_events(schedule: Schedule, names: Sequence[str]) -> list[dict[str, Any]]:
    """Pipeline schedules: ``PIPELINE_PERIODS`` copies of the pattern, one track per GPU
    (``F``/``B`` of stage ``k`` on mini-batch ``b``) and one per link (``x[k]``/``g[k]``).
    """
    period = schedule.period or 0.0
    per_period = schedule.batches_per_period or 1
    gpus = sorted(p.gpu for p in schedule.pattern or [])
    links = sorted({tuple(sorted((t.src, t.dst))) for t in schedule.transfers or []})
    link_tid = {link: GPU_TID_BASE + (max(gpus, default=0) + 1) + i for i, link in enumerate(links)}
    events: list[dict[str, Any]] = []
    for gpu in gpus:
        name = {"name": f"GPU {gpu}"}
        events.append(
            {"name": "thread_name", "ph": "M", "pid": _PID, "tid": GPU_TID_BASE + gpu, "args": name}
        )
    for (a, b), tid in link_tid.items():
        name = {"name": f"link {a}-{b}"}
        events.append({"name": "thread_name", "ph": "M", "pid": _PID, "tid": tid, "args": name})
    shifts = [op.shift for p in schedule.pattern or [] for op in p.ops]
    for copy in range(max(shifts, default=0) + PIPELINE_PERIODS):
        offset = copy * period
        for pattern in schedule.pattern or []:
            for op in pattern.ops:
                batch = per_period * copy - op.shift
                if batch < 0:  # the steady-state slot of a mini-batch before the first
                    continue
                stage = names[op.stage] if 0 <= op.stage < len(names) else str(op.stage)
                events.append(
                    {
                        "name": f"{op.op} {stage} #{batch}",
                        "cat": op.op,
                        "ph": "X",
                        "ts": _us(offset + op.start),
                        "dur": _us(max(0.0, op.end - op.start)),
                        "pid": _PID,
                        "tid": GPU_TID_BASE + pattern.gpu,
                        "args": {"op": op.op, "stage": op.stage, "batch": batch, "copy": copy},
                    }
                )
        for t in schedule.transfers or []:
            if per_period * copy - t.shift < 0:
                continue
            events.append(
                {
                    "name": f"{t.tensor}[{t.stage}] #{per_period * copy - t.shift}",
                    "cat": "transfer",
                    "ph": "X",
                    "ts": _us(offset + t.start),
                    "dur": _us(max(0.0, t.end - t.start)),
                    "pid": _PID,
                    "tid": link_tid[tuple(sorted((t.src, t.dst)))],
                    "args": {"tensor": t.tensor, "stage": t.stage, "src": t.src, "dst": t.dst},
                }
            )
    return events


def trace_document(
    schedule: Schedule,
    profile: Profile | None = None,
    memory_curve: Sequence[tuple[float, int]] | None = None,
) -> dict[str, Any]:
    """``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``."""
    return {
        "traceEvents": trace_events(schedule, profile, memory_curve),
        "displayTimeUnit": "ms",
        "otherData": {
            "algorithm": schedule.algorithm,
            "model": schedule.profile.model,
            "profile_sha256": schedule.profile.sha256,
            "makespan_ms": schedule.makespan,
            "peak_memory": schedule.peak_memory,
            "budget": schedule.budget.memory,
        },
    }


def write_trace(
    path: str | os.PathLike[str],
    schedule: Schedule,
    profile: Profile | None = None,
    memory_curve: Sequence[tuple[float, int]] | None = None,
) -> None:
    """Write :func:`trace_document` as JSON to ``path``, atomically."""
    write_atomic(path, json.dumps(trace_document(schedule, profile, memory_curve)) + "\n")
