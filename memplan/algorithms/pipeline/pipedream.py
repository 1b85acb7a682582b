"""PipeDream: contiguous partition by dynamic programming, 1F1B schedule (Pipelined Model Parallelism, Euro-Par 2021; §4, §7).

The partition is PipeDream's (Narayanan et al. 2019) restricted to model parallelism: a chain
load-balancing dynamic program over contiguous groups of stages, one group per GPU, minimizing the
bottleneck ``max(group compute time, link time of a group boundary)``; O(P L^2). Its memory test is
PipeDream's coarse estimate (weights, plus the group's stashes times its number of in-flight
mini-batches), too coarse to trust (§7): as in the paper's experiments, every candidate
(number of GPUs used, NOAM = number of in-flight mini-batches admitted at the first GPU, with and
without the coarse memory test) is timed as a 1F1B pattern and replayed by the simulator, and
the fastest one whose *simulated* per-GPU peak fits is kept.

1F1B with NOAM ``n`` on groups ``0..P'-1``: group ``s`` keeps ``k_s = max(1, n - s)`` mini-batches in
flight: in every period it runs the forwards of its newest mini-batch, then the backwards of the
one ``k_s - 1`` periods older (shifts ``h_F(s)`` and ``h_B(s) = h_F(s) + k_s - 1``, with
``h_F(s+1) = h_F(s) + [k_s > 1]``). The period is the least one of these orders and shifts
(NOTE [ periodic timing with fixed orders ]), the period the eager 1F1B execution settles to.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from memplan.algorithms.pipeline.model import PipelineInstance
from memplan.algorithms.pipeline.plan import PipelinePlan, evaluate, timed_groups


def partition(
    inst: PipelineInstance, parts: int, memory: int | None = None, noam: int = 1
) -> list[int] | None:
    """Best contiguous split into exactly ``parts`` groups (stage -> group index), or None.

    With ``memory``, a group ``s`` must pass PipeDream's estimate: static weights plus
    ``max(1, noam - s)`` copies of its stashes within ``memory``.
    """
    L = inst.length
    if parts > L:
        return None
    work = np.concatenate([[0.0], np.cumsum(inst.forward + inst.backward)])
    stash = np.concatenate([[0], np.cumsum(inst.stash)])
    weights = np.concatenate([[0], np.cumsum(inst.weights)])
    link = [0.0] + [
        inst.transfer_time(inst.x_size[k]) + inst.transfer_time(inst.g_size[k]) for k in range(1, L)
    ]
    per_weight = inst.static_on([int(np.argmax(inst.weights))]) / max(1, int(inst.weights.max()))
    inf = float("inf")
    best = np.full((parts + 1, L + 1), inf)
    cut = np.zeros((parts + 1, L + 1), dtype=np.int64)
    best[0][0] = 0.0
    for s in range(1, parts + 1):
        inflight = max(1, noam - (s - 1))
        for j in range(s, L + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == inf:
                    continue
                if memory is not None:
                    need = per_weight * (weights[j] - weights[i]) + inflight * (stash[j] - stash[i])
                    if need > memory:
                        continue
                cost = max(best[s - 1][i], work[j] - work[i], link[i] if i > 0 else 0.0)
                if cost < best[s][j]:
                    best[s][j], cut[s][j] = cost, i
    if best[parts][L] == inf:
        return None
    assignment = [0] * L
    j = L
    for s in range(parts, 0, -1):
        i = int(cut[s][j])
        for k in range(i, j):
            assignment[k] = s - 1
        j = i
    return assignment


def one_f_one_b(inst: PipelineInstance, assignment: list[int], noam: int) -> PipelinePlan | None:
    """Time the 1F1B pattern of a contiguous assignment with ``noam`` in-flight mini-batches."""
    groups = max(assignment) + 1
    hf = [0] * groups
    hb = [0] * groups
    for s in range(groups):
        k = max(1, noam - s)
        if s > 0:
            hf[s] = hf[s - 1] + (1 if max(1, noam - (s - 1)) > 1 else 0)
        hb[s] = hf[s] + k - 1
    shifts_f = [hf[assignment[k]] for k in range(inst.length)]
    shifts_b = [hb[assignment[k]] for k in range(inst.length)]
    plan = timed_groups(inst, assignment, shifts_f, shifts_b)
    if plan is not None:
        plan.details["noam"] = noam
    return plan


def candidates(
    profile, inst: PipelineInstance, memory: int | None, optimizer: str, deadline: float = math.inf
):
    """Every (plan, simulated result) of the sweep, deduplicated (the blue dots of Fig. 11-16).

    Past ``deadline`` (a ``time.perf_counter()`` instant: pipeline-ilp's warm start) the sweep
    stops with the candidates timed so far, at least one when there is one.
    """
    seen: set[tuple[tuple[int, ...], int]] = set()
    out = []
    for parts in range(1, min(inst.gpus, inst.length) + 1):
        for noam in range(1, parts + 4):
            for cap in (None, memory):
                if out and time.perf_counter() > deadline:
                    return out
                assignment = partition(inst, parts, cap, noam)
                if assignment is None or (tuple(assignment), noam) in seen:
                    continue
                seen.add((tuple(assignment), noam))
                plan = one_f_one_b(inst, assignment, noam)
                if plan is None:
                    continue
                out.append((plan, evaluate(profile, inst, plan, optimizer)))
    return out


def solve_pipedream(
    profile, inst: PipelineInstance, memory: int, optimizer: str, deadline: float = math.inf
):
    """The fastest PipeDream candidate whose simulated per-GPU peak fits ``memory`` (among those
    timed by ``deadline``, see :func:`candidates`).

    Returns ``(plan or None, simulated peaks or None, least simulated peak over all candidates)``.
    """
    return fastest_fitting(candidates(profile, inst, memory, optimizer, deadline), memory)


def fastest_fitting(pairs: Iterable[tuple[Any, Any]], memory: int):
    """Among replayed ``(plan, simulation result)`` pairs, the fastest (least period per
    mini-batch, then least peak) whose simulated per-GPU peak fits ``memory``.

    Returns ``(plan or None, its simulated GPU peaks or None, least simulated peak of any pair)``;
    invalid replays are skipped (the timing makes valid patterns).
    """
    best = None
    least = None
    for plan, result in pairs:
        if not result.valid:  # pragma: no cover - the timing makes valid patterns
            continue
        peak = result.peak_memory
        least = peak if least is None else min(least, peak)
        if peak <= memory:
            key = (plan.time_per_batch, peak)
            if best is None or key < best[0]:
                best = (key, plan, result.gpu_peaks)
    if best is None:
        return None, None, least
    return best[1], best[2], least
