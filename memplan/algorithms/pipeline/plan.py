"""A pipeline algorithm's answer and its conversion to a :class:`memplan.schedule.Schedule`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from memplan.algorithms.pipeline.model import PipelineInstance
from memplan.algorithms.pipeline.timing import FixedPattern, solve_period
from memplan.profile.model import Profile
from memplan.schedule import (
    Budget,
    GpuPattern,
    PatternOp,
    PatternTransfer,
    ProfileRef,
    Schedule,
    SolverInfo,
    Status,
    overhead_ratio,
)
from memplan.simulator.pipeline import PipelineSimulationResult, simulate_pipeline

CompOp = tuple[Literal["F", "B"], int, float, float, int]
"""``(op "F"|"B", stage, start, end, shift)``."""
CommOp = tuple[Literal["x", "g"], int, int, int, float, float, int]
"""``(tensor "x"|"g", boundary k, src, dst, start, end, shift)``."""


@dataclass
class PipelinePlan:
    """A periodic pattern (*Pipelined Model Parallelism*, Euro-Par 2021, Definition 1) before it becomes a schedule."""

    assignment: list[int]
    period: float
    ops: list[CompOp]
    transfers: list[CommOp]
    r: int = 1
    versions: int = 2
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def time_per_batch(self) -> float:
        """Ms per mini-batch in the steady state (period / batches per period)."""
        return self.period / self.r


def timed_groups(
    inst: PipelineInstance,
    assignment: list[int],
    shifts_f: list[int],
    shifts_b: list[int],
    r: int = 1,
    micro_shifts: list[int] | None = None,
    versions: int = 2,
    grid: float | None = None,
) -> PipelinePlan | None:
    """Time a pattern for a contiguous assignment with per-stage shifts (fixed orders).

    Each GPU runs, per mini-batch instance, its forwards in order then (after every forward
    instance) its backwards in reverse order: for ``r = 1`` this is 1F1B (PipeDream), for
    ``r = M`` micro-batches the GPipe fill-drain. Instance ``j`` of every operation has shift
    ``shift + micro_shifts[j]``. Links carry their ``x`` transfers, then their ``g`` transfers
    (last stage first).
    """
    L = inst.length
    micro = micro_shifts if micro_shifts is not None else [0]
    pat = FixedPattern(r=r)

    def dur(ms: float) -> float:
        """With ``grid``: rounded up to it (the ILP's integer durations), for hints only."""
        return ms if grid is None else float(np.ceil(ms / grid - 1e-9) * grid)

    F = [
        [pat.add(dur(inst.forward[k]), shifts_f[k] + micro[j]) for k in range(L)] for j in range(r)
    ]
    B = [
        [pat.add(dur(inst.backward[k]), shifts_b[k] + micro[j]) for k in range(L)] for j in range(r)
    ]
    X: dict[tuple[int, int], int] = {}
    G: dict[tuple[int, int], int] = {}
    for j in range(r):
        for k in range(1, L):
            if assignment[k - 1] != assignment[k]:
                X[j, k] = pat.add(
                    dur(inst.transfer_time(inst.x_size[k])), shifts_f[k - 1] + micro[j]
                )
                G[j, k] = pat.add(dur(inst.transfer_time(inst.g_size[k])), shifts_b[k] + micro[j])
    for j in range(r):
        for k in range(1, L):
            if (j, k) in X:
                pat.deps += [(F[j][k - 1], X[j, k]), (X[j, k], F[j][k])]
                pat.deps += [(B[j][k], G[j, k]), (G[j, k], B[j][k - 1])]
            else:
                pat.deps += [(F[j][k - 1], F[j][k]), (B[j][k], B[j][k - 1])]
        pat.deps.append((F[j][L - 1], B[j][L - 1]))
    for g in sorted(set(assignment)):
        mine = [k for k in range(L) if assignment[k] == g]
        order = [F[j][k] for j in range(r) for k in mine]
        order += [B[j][k] for j in range(r) for k in reversed(mine)]
        pat.orders.append(order)
    links: dict[tuple[int, int], list[int]] = {}
    for (_j, k), node in sorted(X.items()):
        links.setdefault(_link(assignment, k), []).append(node)
    for (_j, k), node in sorted(G.items(), key=lambda item: (item[0][0], -item[0][1])):
        # backwards run from the last stage down: a link's gradients go in that order
        links.setdefault(_link(assignment, k), []).append(node)
    pat.orders += list(links.values())
    found = solve_period(pat, grid=grid)
    if found is None:
        return None
    period, tau = found
    ops, transfers = _timed_operations(pat, tau, assignment, F, B, X, G)
    return PipelinePlan(assignment, period, ops, transfers, r=r, versions=versions)


def _timed_operations(
    pat: FixedPattern,
    tau: np.ndarray,
    assignment: list[int],
    F: list[list[int]],
    B: list[list[int]],
    X: dict[tuple[int, int], int],
    G: dict[tuple[int, int], int],
) -> tuple[list[CompOp], list[CommOp]]:
    """The operations and transfers of a timed pattern (``tau``: each node's start)."""
    d, s = pat.durations, pat.shifts
    ops: list[CompOp] = []
    for fs, bs in zip(F, B, strict=True):
        for k, (f, b) in enumerate(zip(fs, bs, strict=True)):
            ops.append(("F", k, tau[f], tau[f] + d[f], s[f]))
            ops.append(("B", k, tau[b], tau[b] + d[b], s[b]))
    transfers: list[CommOp] = []
    for (_j, k), node in X.items():
        src, dst = assignment[k - 1], assignment[k]
        transfers.append(("x", k, src, dst, tau[node], tau[node] + d[node], s[node]))
    for (_j, k), node in G.items():
        src, dst = assignment[k], assignment[k - 1]
        transfers.append(("g", k, src, dst, tau[node], tau[node] + d[node], s[node]))
    return ops, transfers


def _link(assignment: list[int], k: int) -> tuple[int, int]:
    a, b = assignment[k - 1], assignment[k]
    return (min(a, b), max(a, b))


def contiguous_groups(assignment: list[int]) -> list[list[int]]:
    """The runs of equal GPUs in a contiguous assignment, in order."""
    groups: list[list[int]] = []
    for k, g in enumerate(assignment):
        if groups and assignment[groups[-1][-1]] == g:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def to_schedule(
    profile: Profile,
    memory: int | None,
    algorithm: str,
    inst: PipelineInstance,
    plan: PipelinePlan | None,
    *,
    started: float,
    status: Status,
    message: str | None = None,
    lower_bound: float | None = None,
    gpu_memory: list[int] | None = None,
) -> Schedule:
    """Wrap a plan (or its absence) as a ``pipeline`` schedule for a per-GPU budget ``memory``."""
    lb = inst.period_lower_bound() if lower_bound is None else lower_bound
    ref = ProfileRef(model=profile.model, sha256=profile.sha256(), stages=profile.length)
    budget = Budget(memory=memory, gpus=inst.gpus, optimizer=inst.optimizer)
    seconds = time.perf_counter() - started
    if plan is None:
        return Schedule(
            family="pipeline",
            algorithm=algorithm,
            profile=ref,
            budget=budget,
            lower_bound=lb,
            static_memory=0,
            link_bandwidth=inst.link_bandwidth,
            feasible=False,
            solver=SolverInfo(seconds=seconds, status="infeasible", message=message),
        )
    by_gpu: dict[int, list[PatternOp]] = {}
    for name, k, a, b, s in sorted(plan.ops, key=lambda o: (o[2], o[0], o[1])):
        by_gpu.setdefault(plan.assignment[k], []).append(
            PatternOp(op=name, stage=k, start=float(a), end=float(b), shift=int(s))
        )
    transfers = [
        PatternTransfer(
            tensor=t, stage=k, src=src, dst=dst, start=float(a), end=float(b), shift=int(s)
        )
        for t, k, src, dst, a, b, s in sorted(plan.transfers, key=lambda o: (o[4], o[0], o[1]))
    ]
    batch = inst.batch_size * plan.r
    static = sum(
        inst.static_on([k for k in range(inst.length) if plan.assignment[k] == g], plan.versions)
        for g in set(plan.assignment)
    )
    return Schedule(
        family="pipeline",
        algorithm=algorithm,
        profile=ref,
        budget=budget,
        lower_bound=lb,
        link_bandwidth=inst.link_bandwidth,
        feasible=True,
        makespan=float(plan.period),
        overhead=overhead_ratio(plan.time_per_batch, lb),
        static_memory=int(static),
        solver=SolverInfo(seconds=seconds, status=status, message=message),
        assignment=list(plan.assignment),
        period=float(plan.period),
        throughput=batch / plan.period * 1e3,
        batches_per_period=plan.r,
        weight_versions=plan.versions,
        gpu_memory=gpu_memory,
        pattern=[GpuPattern(gpu=g, ops=ops) for g, ops in sorted(by_gpu.items())],
        transfers=transfers,
    )


def evaluate(
    profile: Profile, inst: PipelineInstance, plan: PipelinePlan
) -> PipelineSimulationResult:
    """Replay a plan with the simulator, without a budget."""
    sched = to_schedule(
        profile, None, "candidate", inst, plan, started=time.perf_counter(), status="feasible"
    )
    return simulate_pipeline(profile, sched, None)
