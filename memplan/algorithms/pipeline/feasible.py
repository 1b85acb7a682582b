"""Feasibility first: a least-memory pattern for any allocation (Pipelined Model Parallelism, Euro-Par 2021; §6.2, Lemma 2).

NOTE [ pipeline feasibility first ]
Below PipeDream's least simulated peak the ILP has to find a plan from nothing, which CP-SAT may
not do within its time. With one mini-batch in flight (every shift 0: ``F_0 .. F_{L-1}``, then
``B_{L-1} .. B_0``, transfers between) every stage's stash is live from its ``F`` to its ``B``, so
at the start of the last backward on a GPU all of that GPU's stashes are live: the GPU needs about
``sum over its stages of (static copies of the weights + stash)`` plus an overhead, whatever the
pattern (any pattern holds at least one mini-batch's stashes of a GPU at once). Spreading the
stages over the GPUs so that this sum is balanced is a bin packing (any allocation, not only
contiguous ones: Lemma 2's gap); CP-SAT solves it in a second or two. The candidate allocations it
returns are timed as one-in-flight patterns (:func:`timed_groups` with all shifts 0) and replayed
by the simulator; the one with the least period whose simulated peak fits is kept. ``pipeline-ilp``
uses it as its warm start where PipeDream has none, and returns it when CP-SAT finds nothing better.
"""

from __future__ import annotations

import time
from typing import Any

from memplan import interrupt
from memplan.algorithms.pipeline.model import PipelineInstance, static_factor
from memplan.algorithms.pipeline.plan import PipelinePlan, evaluate, timed_groups

ROUNDS = 6
"""Packings tried: each round tightens the estimate's limit by the simulator's overshoot."""


def _pack(
    inst: PipelineInstance, limit: int | None, avoid: list[list[int]], seconds: float
) -> list[int] | None:
    """Stages -> GPUs with every GPU's estimate within ``limit`` (fewest boundaries crossed), or
    the least largest estimate when ``limit`` is None; ``avoid`` lists allocations already tried."""
    from ortools.sat.python import cp_model

    L, P = inst.length, min(inst.gpus, inst.length)
    per = static_factor(inst.optimizer, 2)
    item = [int(per * inst.weights[k] + inst.stash[k]) for k in range(L)]
    over = [int(max(inst.f_overhead[k], inst.b_overhead[k])) for k in range(L)]
    m = cp_model.CpModel()
    x = [[m.new_bool_var(f"x_{k}_{g}") for g in range(P)] for k in range(L)]
    for k in range(L):
        m.add_exactly_one(x[k])
    m.add(x[0][0] == 1)
    top = sum(item) + max(over)
    M = m.new_int_var(0, top, "M")
    for g in range(P):
        load = sum(item[k] * x[k][g] for k in range(L))
        worst = m.new_int_var(0, max(over), f"over_{g}")
        for k in range(L):
            m.add(worst >= over[k]).only_enforce_if(x[k][g])
        m.add(load + worst <= M)
    cut = []
    for k in range(1, L):
        c = m.new_bool_var(f"cut_{k}")
        for g in range(P):
            m.add_implication(x[k][g], c).only_enforce_if(x[k - 1][g].Not())
        cut.append(c)
    for old in avoid:
        m.add_bool_or([x[k][g].Not() for k, g in enumerate(old)])
    if limit is None:
        for k in range(L):  # a feasible start: the contiguous split into P nearly equal runs
            for g in range(P):
                m.add_hint(x[k][g], int(g == k * P // L))
        m.minimize(M * L + sum(cut))
    else:
        m.add(limit >= M)
        m.minimize(sum(cut))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, seconds)
    solver.parameters.num_workers = 2
    status = interrupt.solve(solver, m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return [next(g for g in range(P) if solver.value(x[k][g])) for k in range(L)]


def one_in_flight(inst: PipelineInstance, assignment: list[int]) -> PipelinePlan | None:
    """The pattern of ``assignment`` with every shift 0 (one mini-batch in flight)."""
    zeros = [0] * inst.length
    plan = timed_groups(inst, assignment, zeros, zeros)
    if plan is not None:
        plan.details["noam"] = 1
    return plan


def least_memory_plan(
    profile: Any, inst: PipelineInstance, memory: int | None, seconds: float = 5.0
) -> tuple[PipelinePlan | None, list[int] | None, int | None]:
    """A one-in-flight plan on a packed allocation: the fastest found that fits ``memory``.

    Returns ``(plan or None, its simulated peaks or None, least simulated peak seen)``; with
    ``memory`` None, the plan of least simulated peak. Every plan is replayed by the simulator.
    """
    started = time.perf_counter()
    per_round = max(0.1, seconds / ROUNDS)
    tried: list[list[int]] = []
    best: tuple[tuple[float, int], PipelinePlan, list[int]] | None = None
    least: int | None = None
    limit: int | None = None
    assignment = _pack(inst, None, tried, per_round)
    for _ in range(ROUNDS):
        if assignment is None or (tried and time.perf_counter() - started > seconds):
            break
        tried.append(assignment)
        plan = one_in_flight(inst, assignment)
        result = None if plan is None else evaluate(profile, inst, plan, inst.optimizer)
        if plan is not None and result is not None and result.valid:
            peak = int(result.peak_memory)
            least = peak if least is None else min(least, peak)
            fits = memory is None or peak <= memory
            key = (plan.period, peak) if memory is not None else (peak, plan.period)
            if fits and (best is None or key < best[0]):
                best = (key, plan, list(result.gpu_peaks))
            # estimate the packing's own error from this replay and aim below the budget
            # (or, with no budget, below the least peak seen)
            slack = peak - _estimate(inst, assignment)
            target = memory if memory is not None else least - 1
            limit = target - max(0, slack)
            if limit <= 0:
                break
        assignment = _pack(inst, limit, tried, per_round)
    if best is None:
        return None, None, least
    return best[1], best[2], least


def _estimate(inst: PipelineInstance, assignment: list[int]) -> int:
    """The packing's estimate of the largest GPU (see :func:`_pack`)."""
    per = static_factor(inst.optimizer, 2)
    worst = 0
    for g in set(assignment):
        mine = [k for k, a in enumerate(assignment) if a == g]
        load = sum(int(per * inst.weights[k] + inst.stash[k]) for k in mine)
        over = max(int(max(inst.f_overhead[k], inst.b_overhead[k])) for k in mine)
        worst = max(worst, load + over)
    return worst
