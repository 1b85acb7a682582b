"""The period-minimizing ILP of Pipelined Model Parallelism (Euro-Par 2021) §6, as a CP-SAT model (``pipeline-ilp``).

NOTE [ pipeline ILP in CP-SAT ]
Tasks ``T_1 .. T_2L`` are ``F_0 .. F_{L-1}, B_{L-1} .. B_0`` (0-based stages); transfer ``c_j``
sits between ``T_j`` and ``T_{j+1}`` except between ``F_{L-1}`` and ``B_{L-1}`` (same GPU, (4)).
Times are integers in units of ``u`` ms (durations rounded *up*), sizes in units of ``mu`` bytes
(rounded up, the budget rounded down), so a plan of the model is a plan of the real instance.

* Allocation: ``y_k`` (GPU of stage ``k``) channelled to booleans ``x[k][g]``; the paper's
  ``z``, ``f`` and (1)-(3) become symmetry breaking instead: ``y_0 = 0`` and
  ``y_k <= max(y_0..y_{k-1}) + 1`` (GPUs numbered by first use).
* (5)-(7), (14)-(16): instead of big-M pairs, optional intervals per GPU (present iff the stage is
  on it) and per link (present iff the boundary's two stages are on that pair of GPUs) under
  ``NoOverlap``. (17)-(21): every end lies in ``[0, T]`` and each GPU / link's operations lie in a
  window of length ``T`` (``hi - lo <= T``), which with ``NoOverlap`` forbids overlaps between copies.
* (23)-(30): each step ``T_j -> c_j -> T_{j+1}`` gets an index shift ``v + v'`` in {0, 1, 2}
  with ``start_succ + (v + v') T >= end_pred``; the shift ``h`` of every task is the sum along the
  chain (Lemma 9), ``h(F_0) = 0``.
* (31)-(32), Lemma 10: at the start of task ``j``, stage ``k`` on the same GPU holds
  ``h(B_k) - h(F_k) + [start F_k <= start j] - [end B_k <= start j]`` stashes; the gradient between
  ``B_{k+1}`` and ``B_k`` on one GPU likewise. (22), (34)-(35): the received ``x[k]``, the received
  and sent ``g[k]`` (communication buffers) are reserved at ``ceil(lifetime / T)`` copies for the
  whole period, an upper bound of their live copies.
* (33), (36): at the start of every task, static weights (NOTE [ pipeline memory model ]) plus
  buffers plus stashes and gradients plus the task's overhead fit in ``M``. Between task starts
  only frees happen (buffers aside, reserved at their peak), so this bounds the whole period.

The model is conservative where §6 is exact only through its buffers (one copy each in §6.2.4,
their real lifetime here): every solution it returns replays within the budget in the simulator.
It is warm-started from PipeDream's best plan (its assignment and times as hints). The best of
the ILP's plan and PipeDream's is returned (the message says which), with CP-SAT's bound.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from memplan import interrupt
from memplan.algorithms.pipeline.model import PipelineInstance, static_factor
from memplan.algorithms.pipeline.plan import PipelinePlan, evaluate, to_schedule

TIME_STEPS = 1_000_000
"""Time unit: 0.1 us, or the sum of all durations / TIME_STEPS when larger (durations round up)."""
MEMORY_STEPS = 1_000_000
"""The budget is this many memory units."""


class _Vars:
    """Handles on the model's variables, for hints and for reading the solution."""

    def __init__(self) -> None:
        self.T: Any = None
        self.y: list[Any] = []
        self.start: list[Any] = []
        self.cstart: dict[int, Any] = {}
        self.h: list[Any] = []
        self.hc: dict[int, Any] = {}
        self.steps: dict[str, tuple[Any, Any]] = {}


def _task(L: int, j: int) -> tuple[str, int]:
    return ("F", j) if j < L else ("B", 2 * L - 1 - j)


def _boundary(L: int, j: int) -> tuple[str, int] | None:
    """The transfer after task j: ("x", k) or ("g", k), or None (F_{L-1} -> B_{L-1})."""
    if j < L - 1:
        return ("x", j + 1)
    if j >= L:
        return ("g", 2 * L - 1 - j)
    return None


def build_model(inst: PipelineInstance, memory: int):
    """The CP-SAT model, its variables, and the units (ms per time unit, bytes per memory unit)."""
    from ortools.sat.python import cp_model

    L, P = inst.length, min(inst.gpus, inst.length)
    total = float((inst.forward + inst.backward).sum())
    comm_ms = {("x", k): inst.transfer_time(inst.x_size[k]) for k in range(1, L)} | {
        ("g", k): inst.transfer_time(inst.g_size[k]) for k in range(1, L)
    }
    total += sum(comm_ms.values())
    u = max(1e-4, total / TIME_STEPS)
    every = [*inst.forward, *inst.backward, *comm_ms.values()]
    for grid in (1.0, 0.5, 0.25, 0.1, 0.05, 0.01, 1e-3):  # an exact grid when there is one
        if grid > u and all(abs(t / grid - round(t / grid)) < 1e-9 for t in every):
            u = grid
            break
    mu = max(1, memory // MEMORY_STEPS)

    def units(ms: float) -> int:
        return int(math.ceil(ms / u - 1e-9))

    def mem(nbytes: int) -> int:
        return -(-int(nbytes) // mu)

    n = 2 * L
    d = []
    for j in range(n):
        kind, k = _task(L, j)
        d.append(units(inst.forward[k] if kind == "F" else inst.backward[k]))
    dc = {j: units(comm_ms[_boundary(L, j)]) for j in range(n - 1) if _boundary(L, j)}
    budget = memory // mu
    horizon = sum(d) + sum(dc.values()) + 1
    lb = max(units(inst.period_lower_bound()), max(d), 1)
    lb = max(lb, 1)

    m = cp_model.CpModel()
    v = _Vars()
    T = m.new_int_var(lb, horizon, "T")
    v.T = T
    # allocation and symmetry breaking
    y = [m.new_int_var(0, P - 1, f"y_{k}") for k in range(L)]
    v.y = y
    x = [[m.new_bool_var(f"x_{k}_{g}") for g in range(P)] for k in range(L)]
    for k in range(L):
        m.add_map_domain(y[k], x[k])
    m.add(y[0] == 0)
    top = y[0]
    for k in range(1, L):
        m.add(y[k] <= top + 1)
        nxt = m.new_int_var(0, P - 1, f"top_{k}")
        m.add_max_equality(nxt, [top, y[k]])
        top = nxt
    same = {}
    for k in range(L):
        for k2 in range(k + 1, L):
            b = m.new_bool_var(f"same_{k}_{k2}")
            m.add(y[k] == y[k2]).only_enforce_if(b)
            m.add(y[k] != y[k2]).only_enforce_if(~b)
            same[k, k2] = same[k2, k] = b

    def is_same(k: int, k2: int):
        return 1 if k == k2 else same[k, k2]

    # tasks: ends in [0, T]
    start = [m.new_int_var(-d[j], horizon, f"start_{j}") for j in range(n)]
    v.start = start
    for j in range(n):
        m.add(start[j] + d[j] >= 0)
        m.add(start[j] + d[j] <= T)
    stage_of = [_task(L, j)[1] for j in range(n)]
    for g in range(P):
        lo = m.new_int_var(-horizon, horizon, f"lo_{g}")
        hi = m.new_int_var(-horizon, horizon, f"hi_{g}")
        ivs = []
        for j in range(n):
            lit = x[stage_of[j]][g]
            ivs.append(m.new_optional_fixed_size_interval_var(start[j], d[j], lit, f"task_{j}_{g}"))
            m.add(lo <= start[j]).only_enforce_if(lit)
            m.add(hi >= start[j] + d[j]).only_enforce_if(lit)
        m.add_no_overlap(ivs)
        m.add(hi - lo <= T)
    # transfers: present on link {g, h} iff the boundary's stages sit on g and h
    cross = {k: same[k - 1, k].Not() for k in range(1, L)}
    cstart, cend = {}, {}
    for j, dur in dc.items():
        kind, k = _boundary(L, j)
        cstart[j] = m.new_int_var(-dur, horizon, f"cstart_{j}")
        cend[j] = m.new_int_var(0, horizon, f"cend_{j}")
        m.add(cend[j] == cstart[j] + dur).only_enforce_if(cross[k])
        m.add(cend[j] == cstart[j]).only_enforce_if(cross[k].Not())
        m.add(cend[j] <= T)
    v.cstart = cstart
    by_boundary: dict[int, list[int]] = {}
    for j in dc:
        by_boundary.setdefault(_boundary(L, j)[1], []).append(j)
    for g in range(P):
        for g2 in range(g + 1, P):
            lits = {}
            for k in range(1, L):
                a = m.new_bool_var(f"dir_{k}_{g}_{g2}")
                b = m.new_bool_var(f"dir_{k}_{g2}_{g}")
                for lit, (p, q) in ((a, (g, g2)), (b, (g2, g))):
                    m.add_implication(lit, x[k - 1][p])
                    m.add_implication(lit, x[k][q])
                    m.add_bool_or([lit, x[k - 1][p].Not(), x[k][q].Not()])
                pair = m.new_bool_var(f"link_{k}_{g}_{g2}")
                m.add_bool_or([a, b]).only_enforce_if(pair)
                m.add_implication(a, pair)
                m.add_implication(b, pair)
                lits[k] = pair
            if not any(dc[j] > 0 for j in dc):
                continue
            lo = m.new_int_var(-horizon, horizon, f"llo_{g}_{g2}")
            hi = m.new_int_var(-horizon, horizon, f"lhi_{g}_{g2}")
            ivs = []
            for k, js in by_boundary.items():
                for j in js:
                    if dc[j] == 0:
                        continue
                    lit = lits[k]
                    ivs.append(
                        m.new_optional_fixed_size_interval_var(
                            cstart[j], dc[j], lit, f"comm_{j}_{g}_{g2}"
                        )
                    )
                    m.add(lo <= cstart[j]).only_enforce_if(lit)
                    m.add(hi >= cstart[j] + dc[j]).only_enforce_if(lit)
            m.add_no_overlap(ivs)
            m.add(hi - lo <= T)

    # index shifts (23)-(30)
    def step(pred_end, succ_start, name: str):
        b1, b2 = m.new_bool_var(f"v_{name}"), m.new_bool_var(f"w_{name}")
        m.add_implication(b2, b1)
        m.add(succ_start >= pred_end).only_enforce_if(b1.Not())
        m.add(succ_start + T >= pred_end).only_enforce_if(b2.Not())
        m.add(succ_start + 2 * T >= pred_end)
        v.steps[name] = (b1, b2)
        return b1 + b2

    maxh = 4 * n + 4
    h = [m.new_int_var(0, maxh, f"h_{j}") for j in range(n)]
    v.h = h
    m.add(h[0] == 0)
    hc = {}
    for j in range(n - 1):
        if j in dc:
            hc[j] = m.new_int_var(0, maxh, f"hc_{j}")
            m.add(hc[j] == h[j] + step(start[j] + d[j], cstart[j], f"a{j}"))
            m.add(h[j + 1] == hc[j] + step(cend[j], start[j + 1], f"b{j}"))
        else:
            m.add(h[j + 1] == h[j] + step(start[j] + d[j], start[j + 1], f"a{j}"))
    v.hc = hc
    fidx = list(range(L))
    bidx = [2 * L - 1 - k for k in range(L)]

    # memory (Lemma 10 for stashes and same-GPU gradients, reserved buffers for transfers)
    stash = [mem(s) for s in inst.stash]
    grad = [mem(inst.g_size[k + 1]) for k in range(L)]  # g[k+1], input of B_k
    copies = static_factor(inst.optimizer, 2)
    weight = [mem(copies * int(w)) for w in inst.weights]
    f_over = [mem(o) for o in inst.f_overhead]
    b_over = [mem(o) for o in inst.b_overhead]
    top_copies = maxh + 3

    def reserved(alloc_start, alloc_h, free_end, free_h, name: str):
        """ceil(lifetime / T) copies of a buffer: (free_h - alloc_h) + q, q T >= end - start."""
        c1, c2, c3 = (m.new_bool_var(f"q{i}_{name}") for i in range(3))
        m.add_implication(c2, c1)
        m.add_implication(c3, c2)
        diff = free_end - alloc_start
        m.add(diff <= -T).only_enforce_if(c1.Not())
        m.add(diff <= 0).only_enforce_if(c2.Not())
        m.add(diff <= T).only_enforce_if(c3.Not())
        cnt = m.new_int_var(0, top_copies, f"copies_{name}")
        m.add(cnt >= free_h - alloc_h - 1 + c1 + c2 + c3)
        return cnt

    buffers: list[tuple[int, int, Any, Any]] = []  # (stage whose GPU holds it, bytes, count, k)
    for k in range(1, L):
        jx = k - 1  # task F_{k-1}; transfer x[k] after it
        jg = 2 * L - 1 - k  # task B_k; transfer g[k] after it
        if jx in dc and dc[jx] >= 0:
            cnt = reserved(cstart[jx], hc[jx], start[bidx[k]] + d[bidx[k]], h[bidx[k]], f"x{k}")
            buffers.append((k, mem(inst.x_size[k]), cnt, k))
            cnt = reserved(
                cstart[jg], hc[jg], start[bidx[k - 1]] + d[bidx[k - 1]], h[bidx[k - 1]], f"gr{k}"
            )
            buffers.append((k - 1, mem(inst.g_size[k]), cnt, k))
            cnt = reserved(start[jg], h[jg], cend[jg], hc[jg], f"gs{k}")
            buffers.append((k, mem(inst.g_size[k]), cnt, k))
    bufmem = []
    for g in range(P):
        terms = []
        for owner, size, cnt, k in buffers:
            if size == 0:
                continue
            bc = m.new_int_var(0, top_copies, f"buf_{owner}_{k}_{g}_{len(terms)}")
            m.add(bc >= cnt).only_enforce_if([x[owner][g], cross[k]])
            terms.append(size * bc)
        bufmem.append(sum(terms))
    for j in range(n):
        kind, s = _task(L, j)
        live_terms = []
        for k in range(L):
            p = m.new_bool_var(f"p_{k}_{j}")  # F_k started at or before task j
            m.add(start[fidx[k]] > start[j]).only_enforce_if(p.Not())
            q = m.new_bool_var(f"q_{k}_{j}")  # B_k ended at or before task j
            m.add(start[bidx[k]] + d[bidx[k]] <= start[j]).only_enforce_if(q)
            live = h[bidx[k]] - h[fidx[k]] + p - q
            term = stash[k] * live
            if k + 1 < L and grad[k] > 0:
                r = m.new_bool_var(f"r_{k}_{j}")  # B_{k+1} started at or before task j
                m.add(start[bidx[k + 1]] > start[j]).only_enforce_if(r.Not())
                lg = m.new_int_var(0, top_copies, f"lg_{k}_{j}")
                m.add(lg >= h[bidx[k]] - h[bidx[k + 1]] + r - q).only_enforce_if(same[k, k + 1])
                term = term + grad[k] * lg
            cell = m.new_int_var(0, budget, f"mem_{k}_{j}")
            link = is_same(k, s)
            if isinstance(link, int):
                m.add(cell >= term)
            else:
                m.add(cell >= term).only_enforce_if(link)
            live_terms.append(cell)
        over = f_over[s] if kind == "F" else b_over[s]
        for g in range(P):
            static = sum(weight[k] * x[k][g] for k in range(L))
            m.add(sum(live_terms) + over + static + bufmem[g] <= budget).only_enforce_if(x[s][g])
    m.minimize(T)
    return m, v, u, d, dc


def _complete_hint(model, v: _Vars, inst: PipelineInstance, plan: PipelinePlan, u, d, dc) -> bool:
    """Hint every decision variable from a contiguous 1F1B plan, re-timed on the integer grid.

    The plan's orders and shifts are timed again with the ILP's rounded-up durations (so the times
    are integers and the pattern fits them), normalized to ends in ``(0, T]``, and given the least
    index shifts its times allow (Lemma 9), which never need more memory than the plan's own.
    """
    from memplan.algorithms.pipeline.plan import timed_groups

    L = inst.length
    shift = {(o[0], o[1]): o[4] for o in plan.ops}
    timed = timed_groups(
        inst,
        plan.assignment,
        [shift["F", k] for k in range(L)],
        [shift["B", k] for k in range(L)],
        grid=u,
    )
    if timed is None:  # pragma: no cover
        return False
    T = int(round(timed.period / u))
    start = {(o[0], o[1]): int(round(o[2] / u)) for o in timed.ops}
    comm = {(t[0], t[1]): int(round(t[4] / u)) for t in timed.transfers}

    def normal(a: int, dur: int) -> int:
        end = (a + dur) % T
        return (end if end else T) - dur

    tau = [normal(start[_task(L, j)], d[j]) for j in range(2 * L)]
    ctau: dict[int, int] = {}
    cend: dict[int, int] = {}
    for j, dur in dc.items():
        key = _boundary(L, j)
        if key in comm:
            ctau[j] = normal(comm[key], dur)
            cend[j] = ctau[j] + dur
        else:  # same GPU: a zero-length transfer right after its producer
            ctau[j] = cend[j] = tau[j] + d[j]

    def inc(pred_end: int, succ_start: int) -> int:
        return 0 if succ_start >= pred_end else 1 if succ_start + T >= pred_end else 2

    order: dict[int, int] = {}
    for g in plan.assignment:
        order.setdefault(g, len(order))
    for k, g in enumerate(plan.assignment):
        model.add_hint(v.y[k], order[g])
    model.add_hint(v.T, T)
    h = 0
    model.add_hint(v.h[0], 0)
    for j in range(2 * L):
        model.add_hint(v.start[j], tau[j])
    for j in range(2 * L - 1):
        steps = []
        if j in dc:
            model.add_hint(v.cstart[j], ctau[j])
            a = inc(tau[j] + d[j], ctau[j])
            b = inc(cend[j], tau[j + 1])
            model.add_hint(v.hc[j], h + a)
            steps = [(f"a{j}", a), (f"b{j}", b)]
            h += a + b
        else:
            a = inc(tau[j] + d[j], tau[j + 1])
            steps = [(f"a{j}", a)]
            h += a
        for name, value in steps:
            b1, b2 = v.steps[name]
            model.add_hint(b1, int(value >= 1))
            model.add_hint(b2, int(value >= 2))
        model.add_hint(v.h[j + 1], h)
    return True


@dataclass
class IlpOutcome:
    """Both plans ``pipeline-ilp`` weighs: PipeDream's warm start and CP-SAT's own."""

    pd_plan: PipelinePlan | None
    pd_peaks: list[int] | None
    ilp_plan: PipelinePlan | None
    ilp_peaks: list[int] | None
    status: str
    """CP-SAT's final status, lower case (optimal, feasible, infeasible, unknown)."""
    bound: float | None
    """CP-SAT's proven bound on the period of its model (ms)."""
    first_plan: PipelinePlan | None = None
    """Where PipeDream has none: the feasibility-first plan (NOTE [ pipeline feasibility first ])."""
    first_peaks: list[int] | None = None


def solve_ilp(
    profile: Any, inst: PipelineInstance, memory: int, time_limit: float, sink=None
) -> IlpOutcome:
    """PipeDream's best plan, then CP-SAT in two phases within ``time_limit`` seconds.

    Phase 1 fixes PipeDream's assignment (a ``WARM_SHARE`` of the time) and starts from its times;
    phase 2 solves the whole model hinted with phase 1's complete solution. Where PipeDream has no
    plan, the feasibility-first plan (one mini-batch in flight on a packed allocation, replayed by
    the simulator) takes its place as the warm start.
    """
    from ortools.sat.python import cp_model

    from memplan.algorithms.pipeline.pipedream import solve_pipedream

    started = time.perf_counter()
    deadline = started + time_limit  # every phase below stops by it (NOTE [ time limits ])
    pd_plan, pd_peaks, _ = solve_pipedream(
        profile, inst, memory, inst.optimizer, deadline=started + PIPEDREAM_SHARE * time_limit
    )
    L = inst.length
    progress = _Throttle(sink, u=1.0)
    hint: list[int] | None = None
    first_plan = first_peaks = None
    warm = pd_plan
    if pd_plan is None:  # feasibility first (NOTE [ pipeline feasibility first ])
        from memplan.algorithms.pipeline.feasible import least_memory_plan

        left = deadline - time.perf_counter()
        seconds = min(FIRST_SECONDS, max(FIRST_SHARE * time_limit, FIRST_OF_LEFT * left))
        first_plan, first_peaks, _ = least_memory_plan(profile, inst, memory, seconds)
        warm = first_plan
    if warm is not None:  # progress: the plan to beat first, then CP-SAT's improvements on it
        progress.warm_start("pipedream" if warm is pd_plan else "feasibility-first", warm.period)
    solver = status = None
    found_in = None  # the (solver, variables, time unit, durations) of the last solution
    bound = inst.period_lower_bound()  # until the whole model's search proves a better one
    build = 0.0  # seconds one model took to build: phase 2 is skipped when it cannot fit
    if warm is not None and time.perf_counter() < deadline:
        began = time.perf_counter()
        model, v, u, d, dc = build_model(inst, memory)
        build = time.perf_counter() - began
        if not _complete_hint(model, v, inst, warm, u, d, dc):  # pragma: no cover
            _hint_plan(model, v, warm, u, L, d, dc)
        order: dict[int, int] = {}
        for g in warm.assignment:
            order.setdefault(g, len(order))
        for k, g in enumerate(warm.assignment):
            model.add(v.y[k] == order[g])
        left = deadline - time.perf_counter()
        progress.u = u
        if left > 0:
            solver, status = _solve(model, WARM_SHARE * left, progress, "warm start")
            if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                hint = list(solver.response_proto.solution)
                found_in = (solver, v, u, d, dc)
                status = cp_model.FEASIBLE  # optimal for phase 1's fixed assignment only
    if time.perf_counter() + build < deadline:
        model, v, u, d, dc = build_model(inst, memory)
        if hint is not None:
            # the same variables in the same order: phase 1's solution is a complete hint
            model.proto.solution_hint.vars.extend(range(len(hint)))
            model.proto.solution_hint.values.extend(hint)
        elif warm is not None:
            _complete_hint(model, v, inst, warm, u, d, dc)
        progress.u = u
        left = deadline - time.perf_counter()
        if left > 0:
            solver, status = _solve(model, left, progress, "search")
            bound = solver.best_objective_bound * u  # phase 1's would not bound the whole model
            if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                found_in = (solver, v, u, d, dc)
            elif found_in is not None:  # no solution in the time left: keep phase 1's
                status = cp_model.FEASIBLE
    if solver is None:  # no time left for CP-SAT at all
        status = cp_model.UNKNOWN
    found = found_in is not None
    ilp_plan = ilp_peaks = None
    if found:
        solver, v, u, d, dc = found_in
        ilp_plan = _read_plan(solver, v, inst, u, d, dc)
        check = evaluate(profile, inst, ilp_plan, inst.optimizer)
        if check.valid and check.peak_memory <= memory:
            ilp_peaks = check.gpu_peaks
        else:  # pragma: no cover - the model is conservative; keep PipeDream's plan then
            ilp_plan = None
    return IlpOutcome(
        pd_plan,
        pd_peaks,
        ilp_plan,
        ilp_peaks,
        cp_model.CpSolver().status_name(status).lower(),
        bound if found else None,
        first_plan,
        first_peaks,
    )


def run_ilp(profile: Any, request: Any, inst: PipelineInstance):
    """``pipeline-ilp``: the best of CP-SAT's plan and PipeDream's, with CP-SAT's bound."""
    started = time.perf_counter()
    limit = request.options.time_limit
    memory = request.memory
    floor = inst.min_static()
    common = dict(started=started)
    if memory < floor:
        from memplan.units import format_size

        return to_schedule(
            profile,
            request,
            "pipeline-ilp",
            inst,
            None,
            status="infeasible",
            message=f"the heaviest stage alone needs {format_size(floor)} of weights per GPU "
            f"({inst.optimizer}, 2 weight versions)",
            **common,
        )
    out = solve_ilp(profile, inst, memory, limit, request.progress)
    pd_text = "none" if out.pd_plan is None else f"{out.pd_plan.period:.4f} ms"
    if (
        out.ilp_plan is not None
        and (out.pd_plan is None or out.ilp_plan.period <= out.pd_plan.period + 1e-9)
        and (out.first_plan is None or out.ilp_plan.period <= out.first_plan.period + 1e-9)
    ):
        plan, peaks = out.ilp_plan, out.ilp_peaks
        text = f"CP-SAT {out.status}, bound {out.bound:.4f} ms; pipedream warm start: {pd_text}"
        if out.first_plan is not None:
            text += f"; feasibility-first plan {out.first_plan.period:.4f} ms"
        final = "optimal" if out.status == "optimal" else "feasible"
    elif out.pd_plan is not None:
        plan, peaks = out.pd_plan, out.pd_peaks
        own = "none" if out.ilp_plan is None else f"{out.ilp_plan.period:.4f} ms"
        text = (
            f"CP-SAT {out.status} (its plan: {own}) did not beat the pipedream warm start "
            f"{pd_text}: returning pipedream's plan"
        )
        final = "feasible"
    elif out.first_plan is not None:
        plan, peaks = out.first_plan, out.first_peaks
        own = "no plan" if out.ilp_plan is None else f"its plan {out.ilp_plan.period:.4f} ms"
        text = (
            f"CP-SAT {out.status} ({own}) did not beat the feasibility-first plan (one "
            f"mini-batch in flight on a packed allocation); pipedream has none"
        )
        final = "feasible"
    else:
        why = (
            "CP-SAT proves that no pattern of its memory model fits"
            if out.status == "infeasible"
            else f"CP-SAT found no plan within {limit:g} s ({out.status}) and pipedream has none"
        )
        return to_schedule(
            profile, request, "pipeline-ilp", inst, None, status="infeasible", message=why, **common
        )
    return to_schedule(
        profile,
        request,
        "pipeline-ilp",
        inst,
        plan,
        status=final,
        message=f"{len(set(plan.assignment))} of {inst.gpus} GPUs; {text}",
        gpu_memory=peaks,
        **common,
    )


WARM_SHARE = 0.3
"""Share of the time limit spent on PipeDream's assignment before the whole model."""
PIPEDREAM_SHARE = 0.5
"""Share of the time limit after which PipeDream's warm start stops timing candidates."""

# NOTE [ time limits ]
# ``--time-limit`` bounds the whole of pipeline-ilp, not only CP-SAT: PipeDream's candidates stop
# being timed at PIPEDREAM_SHARE of it (the best so far is the warm start); the feasibility-first
# plan gets FIRST_SHARE of it, or FIRST_OF_LEFT of what is left when that is more; the whole model
# is not built when building phase 1's took longer than the time left; and a CP-SAT phase whose
# model is ready after the deadline is not solved (phase 1's solution, or the warm start, is
# returned). What may overrun is one candidate or one model build, plus the final replay
# (docs/benchmarks.md, "Time limits").
FIRST_SHARE = 0.1
"""Share of the time limit (at most ``FIRST_SECONDS``) for the feasibility-first plan..."""
FIRST_OF_LEFT = 0.5
"""... or this share of the time PipeDream left, when larger (its packing needs rounds of a few
tenths of a second on ResNet-152 with 8 GPUs)."""
FIRST_SECONDS = 6.0


class _Throttle:
    """Live progress on stderr: the warm start's period first, then CP-SAT's improvements on it
    (at most one line a second; the last improvement of a phase is always shown)."""

    def __init__(self, sink, u: float) -> None:
        self.sink = sink
        self.u = u
        self.last = -1e9
        self.best: float | None = None
        self.pending: str | None = None

    def warm_start(self, source: str, period: float) -> None:
        """The plan CP-SAT starts from (and must beat): one line, before any of CP-SAT's."""
        self.best = period
        if self.sink is not None:
            self.sink(f"pipeline-ilp (warm start): {source} plan, period {period:.4f} ms")

    def __call__(self, phase: str, wall: float, objective: float, bound: float) -> None:
        if self.sink is None:
            return
        value = objective * self.u
        if self.best is not None and value >= self.best:
            return
        self.best = value
        line = (
            f"pipeline-ilp ({phase}): {wall:6.1f} s  period {value:.4f} ms  "
            f"bound {bound * self.u:.4f} ms"
        )
        now = time.perf_counter()
        if now - self.last < 1.0:
            self.pending = line
            return
        self.last, self.pending = now, None
        self.sink(line)

    def flush(self) -> None:
        """Show the last improvement the one-a-second limit held back."""
        if self.sink is not None and self.pending is not None:
            self.sink(self.pending)
            self.last, self.pending = time.perf_counter(), None


def _solve(model, seconds: float, progress: _Throttle, phase: str):
    """Solve with CP-SAT within ``seconds``, reporting improvements."""
    from ortools.sat.python import cp_model

    class _Callback(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            progress(phase, self.wall_time, self.objective_value, self.best_objective_bound)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, seconds)
    solver.parameters.num_workers = max(1, min(8, os.cpu_count() or 1))
    status = interrupt.solve(solver, model, _Callback())
    progress.flush()
    return solver, status


def _hint_plan(model, v: _Vars, plan: PipelinePlan, u: float, L: int, d, dc) -> None:
    """Hints from a plan: GPUs renumbered by first use, times rounded to units with ends in [0, T]."""
    order: dict[int, int] = {}
    for g in plan.assignment:
        order.setdefault(g, len(order))
    for k, g in enumerate(plan.assignment):
        model.add_hint(v.y[k], order[g])
    T = int(math.ceil(plan.period / u))
    model.add_hint(v.T, T)
    starts = {(o[0], o[1]): o[2] for o in plan.ops}
    for j in range(2 * L):
        kind, k = _task(L, j)
        end = int(round(starts[kind, k] / u)) + d[j]
        model.add_hint(v.start[j], (end % T) - d[j] if end % T else T - d[j])
    comms = {(t[0], t[1]): t[4] for t in plan.transfers}
    for j, dur in dc.items():
        key = _boundary(L, j)
        if key in comms:
            end = int(round(comms[key] / u)) + dur
            model.add_hint(v.cstart[j], (end % T) - dur if end % T else T - dur)


def _read_plan(solver, v: _Vars, inst: PipelineInstance, u: float, d, dc) -> PipelinePlan:
    """The pattern of a solution, in ms with the profile's exact durations."""
    L = inst.length
    y = [int(solver.value(var)) for var in v.y]
    T = int(solver.value(v.T))
    ops = []
    for j in range(2 * L):
        kind, k = _task(L, j)
        a = solver.value(v.start[j]) * u
        dur = inst.forward[k] if kind == "F" else inst.backward[k]
        ops.append((kind, k, a, a + float(dur), int(solver.value(v.h[j]))))
    transfers = []
    for j in dc:
        kind, k = _boundary(L, j)
        if y[k - 1] == y[k]:
            continue
        src, dst = (y[k - 1], y[k]) if kind == "x" else (y[k], y[k - 1])
        a = solver.value(v.cstart[j]) * u
        size = inst.x_size[k] if kind == "x" else inst.g_size[k]
        transfers.append(
            (kind, k, src, dst, a, a + inst.transfer_time(size), int(solver.value(v.hc[j])))
        )
    return PipelinePlan(y, T * u, ops, transfers, r=1, versions=2)
