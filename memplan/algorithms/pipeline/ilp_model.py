"""The period-minimizing ILP of section 6 of *Pipelined Model Parallelism* (Euro-Par 2021) in CP-SAT.

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
It is warm-started from PipeDream's best plan (its assignment and times as hints,
:func:`complete_hint`); :mod:`memplan.algorithms.pipeline.ilp` runs the search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ortools.sat.python import cp_model

from memplan.algorithms.pipeline.model import PipelineInstance, static_factor
from memplan.algorithms.pipeline.plan import CommOp, CompOp, PipelinePlan, timed_groups

TIME_STEPS = 1_000_000
"""Time unit: 0.1 us, or the sum of all durations / TIME_STEPS when larger (durations round up)."""
Expr = cp_model.LinearExpr | int
"""A linear expression of the model (an integer variable is one)."""
MEMORY_STEPS = 1_000_000
"""The budget is this many memory units."""


@dataclass
class ModelVars:
    """Handles on the model's variables, for hints and for reading the solution."""

    T: cp_model.IntVar  # noqa: N815 - the paper's name
    y: list[cp_model.IntVar]
    start: list[cp_model.IntVar] = field(default_factory=list)
    cstart: dict[int, cp_model.IntVar] = field(default_factory=dict)
    h: list[cp_model.IntVar] = field(default_factory=list)
    hc: dict[int, cp_model.IntVar] = field(default_factory=dict)
    steps: dict[str, tuple[cp_model.IntVar, cp_model.IntVar]] = field(default_factory=dict)


@dataclass
class IlpModel:
    """The CP-SAT model, its variables, and its units and integer durations."""

    model: cp_model.CpModel
    vars: ModelVars
    u: float
    """ms per time unit."""
    d: list[int]
    """Duration of task ``j`` in time units."""
    dc: dict[int, int]
    """Duration of the transfer after task ``j`` in time units (boundaries between tasks)."""


def _task(L: int, j: int) -> tuple[Literal["F", "B"], int]:  # noqa: N803 - the paper's name
    return ("F", j) if j < L else ("B", 2 * L - 1 - j)


def _transfer_after(L: int, j: int) -> tuple[Literal["x", "g"], int]:  # noqa: N803
    """The transfer after task j, where there is one."""
    found = _boundary(L, j)
    if found is None:  # pragma: no cover - the callers ask only where there is one
        raise ValueError(f"no transfer after task {j} of {2 * L}")
    return found


def _boundary(L: int, j: int) -> tuple[Literal["x", "g"], int] | None:  # noqa: N803
    """The transfer after task j: ("x", k) or ("g", k), or None (F_{L-1} -> B_{L-1})."""
    if j < L - 1:
        return ("x", j + 1)
    if j >= L:
        return ("g", 2 * L - 1 - j)
    return None


def build_model(inst: PipelineInstance, memory: int) -> IlpModel:
    """The CP-SAT model, its variables, and its units (ms per time unit).

    Built in the order of NOTE [ pipeline ILP in CP-SAT ], one step of :class:`_ModelBuilder`
    each: the allocation, the tasks on the GPUs, the transfers on the links, the index shifts,
    the memory. The variables are created in that order (a hint, and phase 1's solution given
    to phase 2, name them by their index).
    """
    build = _ModelBuilder(inst, memory)
    build.allocation()
    build.tasks()
    build.transfers()
    build.index_shifts()
    build.memory()
    build.m.minimize(build.T)
    return IlpModel(build.m, build.v, build.u, build.d, build.dc)


@dataclass
class _Grid:
    """The integer units of the model: ``u`` ms per time unit, ``mu`` bytes per memory unit."""

    u: float
    mu: int

    @classmethod
    def of(
        cls, inst: PipelineInstance, memory: int, comm_ms: dict[tuple[str, int], float]
    ) -> _Grid:
        """The time unit: the sum of all durations over :data:`TIME_STEPS` (at least 0.1 us),
        or a coarser exact grid of the durations when there is one; the memory unit: the
        budget over :data:`MEMORY_STEPS`.
        """
        total = float((inst.forward + inst.backward).sum()) + sum(comm_ms.values())
        u = max(1e-4, total / TIME_STEPS)
        every = [*inst.forward, *inst.backward, *comm_ms.values()]
        for grid in (1.0, 0.5, 0.25, 0.1, 0.05, 0.01, 1e-3):  # an exact grid when there is one
            if grid > u and all(abs(t / grid - round(t / grid)) < 1e-9 for t in every):
                u = grid
                break
        return cls(u, max(1, memory // MEMORY_STEPS))

    def units(self, ms: float) -> int:
        """A duration in time units, rounded up."""
        return int(math.ceil(ms / self.u - 1e-9))

    def mem(self, nbytes: int) -> int:
        """A size in memory units, rounded up."""
        return -(-int(nbytes) // self.mu)


class _ModelBuilder:
    """The model of :func:`build_model` as it is built, section by section of the NOTE.

    Its attributes are the paper's names: ``x[k][g]`` (stage ``k`` on GPU ``g``), ``same[k, k2]``,
    ``start[j]`` (task ``j``), ``cstart[j]`` / ``cend[j]`` (the transfer after task ``j``),
    ``cross[k]`` (boundary ``k`` between two GPUs), ``h[j]`` / ``hc[j]`` (index shifts).
    """

    def __init__(self, inst: PipelineInstance, memory: int) -> None:
        self.inst = inst
        L = self.L = inst.length  # noqa: N806 - the paper's name
        self.P = min(inst.gpus, L)
        comm_ms = {("x", k): inst.transfer_time(inst.x_size[k]) for k in range(1, L)} | {
            ("g", k): inst.transfer_time(inst.g_size[k]) for k in range(1, L)
        }
        self.grid = grid = _Grid.of(inst, memory, comm_ms)
        self.u = grid.u
        self.n = n = 2 * L
        self.d: list[int] = []
        for j in range(n):
            kind, k = _task(L, j)
            self.d.append(grid.units(inst.forward[k] if kind == "F" else inst.backward[k]))
        self.dc = {
            j: grid.units(comm_ms[_transfer_after(L, j)]) for j in range(n - 1) if _boundary(L, j)
        }
        self.budget = memory // grid.mu
        self.horizon = sum(self.d) + sum(self.dc.values()) + 1
        lb = max(grid.units(inst.period_lower_bound()), max(self.d), 1)
        lb = max(lb, 1)
        self.m = cp_model.CpModel()
        self.T = self.m.new_int_var(lb, self.horizon, "T")

    def allocation(self) -> None:
        """``y_k`` channelled to ``x[k][g]``, GPUs numbered by first use, and ``same``."""
        m, L, P = self.m, self.L, self.P  # noqa: N806
        y = [m.new_int_var(0, P - 1, f"y_{k}") for k in range(L)]
        self.v = ModelVars(T=self.T, y=y)
        self.x = x = [[m.new_bool_var(f"x_{k}_{g}") for g in range(P)] for k in range(L)]
        for k in range(L):
            m.add_map_domain(y[k], x[k])
        m.add(y[0] == 0)
        top = y[0]
        for k in range(1, L):
            m.add(y[k] <= top + 1)
            nxt = m.new_int_var(0, P - 1, f"top_{k}")
            m.add_max_equality(nxt, [top, y[k]])
            top = nxt
        self.same: dict[tuple[int, int], cp_model.IntVar] = {}
        for k in range(L):
            for k2 in range(k + 1, L):
                b = m.new_bool_var(f"same_{k}_{k2}")
                m.add(y[k] == y[k2]).only_enforce_if(b)
                m.add(y[k] != y[k2]).only_enforce_if(~b)
                self.same[k, k2] = self.same[k2, k] = b

    def tasks(self) -> None:
        """(5)-(7), (17)-(21): ends in ``[0, T]``, the tasks of each GPU in a window of ``T``."""
        m, d, T, horizon = self.m, self.d, self.T, self.horizon  # noqa: N806
        self.start = start = [m.new_int_var(-d[j], horizon, f"start_{j}") for j in range(self.n)]
        self.v.start = start
        for j in range(self.n):
            m.add(start[j] + d[j] >= 0)
            m.add(start[j] + d[j] <= T)
        stage_of = [_task(self.L, j)[1] for j in range(self.n)]
        for g in range(self.P):
            lo = m.new_int_var(-horizon, horizon, f"lo_{g}")
            hi = m.new_int_var(-horizon, horizon, f"hi_{g}")
            ivs = []
            for j in range(self.n):
                lit = self.x[stage_of[j]][g]
                ivs.append(
                    m.new_optional_fixed_size_interval_var(start[j], d[j], lit, f"task_{j}_{g}")
                )
                m.add(lo <= start[j]).only_enforce_if(lit)
                m.add(hi >= start[j] + d[j]).only_enforce_if(lit)
            m.add_no_overlap(ivs)
            m.add(hi - lo <= T)

    def transfers(self) -> None:
        """(14)-(21): a transfer is present on link ``{g, h}`` iff the boundary's stages sit on
        ``g`` and ``h``; the transfers of each link in a window of ``T``.
        """
        m, L, dc, T, horizon = self.m, self.L, self.dc, self.T, self.horizon  # noqa: N806
        self.cross = cross = {k: self.same[k - 1, k].Not() for k in range(1, L)}
        self.cstart: dict[int, cp_model.IntVar] = {}
        self.cend: dict[int, cp_model.IntVar] = {}
        for j, dur in dc.items():
            _, k = _transfer_after(L, j)
            self.cstart[j] = m.new_int_var(-dur, horizon, f"cstart_{j}")
            self.cend[j] = m.new_int_var(0, horizon, f"cend_{j}")
            m.add(self.cend[j] == self.cstart[j] + dur).only_enforce_if(cross[k])
            m.add(self.cend[j] == self.cstart[j]).only_enforce_if(cross[k].Not())
            m.add(self.cend[j] <= T)
        self.v.cstart = self.cstart
        by_boundary: dict[int, list[int]] = {}
        for j in dc:
            by_boundary.setdefault(_transfer_after(L, j)[1], []).append(j)
        for g in range(self.P):
            for g2 in range(g + 1, self.P):
                self._link(g, g2, by_boundary)

    def _link(self, g: int, g2: int, by_boundary: dict[int, list[int]]) -> None:
        """The transfers between GPUs ``g`` and ``g2`` (either way) under one ``NoOverlap``."""
        m, x, dc, T, horizon = self.m, self.x, self.dc, self.T, self.horizon  # noqa: N806
        lits = {}
        for k in range(1, self.L):
            a = m.new_bool_var(f"dir_{k}_{g}_{g2}")
            b = m.new_bool_var(f"dir_{k}_{g2}_{g}")
            for lit, (src, dst) in ((a, (g, g2)), (b, (g2, g))):
                m.add_implication(lit, x[k - 1][src])
                m.add_implication(lit, x[k][dst])
                m.add_bool_or([lit, x[k - 1][src].Not(), x[k][dst].Not()])
            pair = m.new_bool_var(f"link_{k}_{g}_{g2}")
            m.add_bool_or([a, b]).only_enforce_if(pair)
            m.add_implication(a, pair)
            m.add_implication(b, pair)
            lits[k] = pair
        if not any(dc[j] > 0 for j in dc):
            return
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
                        self.cstart[j], dc[j], lit, f"comm_{j}_{g}_{g2}"
                    )
                )
                m.add(lo <= self.cstart[j]).only_enforce_if(lit)
                m.add(hi >= self.cstart[j] + dc[j]).only_enforce_if(lit)
        m.add_no_overlap(ivs)
        m.add(hi - lo <= T)

    def _step(self, pred_end: Expr, succ_start: Expr, name: str) -> Expr:
        """(23)-(30): the index shift ``v + v'`` in {0, 1, 2} of one step of the chain."""
        m, T = self.m, self.T  # noqa: N806
        b1, b2 = m.new_bool_var(f"v_{name}"), m.new_bool_var(f"w_{name}")
        m.add_implication(b2, b1)
        m.add(succ_start >= pred_end).only_enforce_if(b1.Not())
        m.add(succ_start + T >= pred_end).only_enforce_if(b2.Not())
        m.add(succ_start + 2 * T >= pred_end)
        self.v.steps[name] = (b1, b2)
        return b1 + b2

    def index_shifts(self) -> None:
        """Lemma 9: the shift ``h`` of every task (and ``hc`` of every transfer), ``h(F_0) = 0``."""
        m, n, d, dc, start = self.m, self.n, self.d, self.dc, self.start
        self.maxh = maxh = 4 * n + 4
        self.h = h = [m.new_int_var(0, maxh, f"h_{j}") for j in range(n)]
        self.v.h = h
        m.add(h[0] == 0)
        self.hc: dict[int, cp_model.IntVar] = {}
        for j in range(n - 1):
            if j in dc:
                self.hc[j] = m.new_int_var(0, maxh, f"hc_{j}")
                m.add(self.hc[j] == h[j] + self._step(start[j] + d[j], self.cstart[j], f"a{j}"))
                m.add(h[j + 1] == self.hc[j] + self._step(self.cend[j], start[j + 1], f"b{j}"))
            else:
                m.add(h[j + 1] == h[j] + self._step(start[j] + d[j], start[j + 1], f"a{j}"))
        self.v.hc = self.hc

    def _reserved(
        self, alloc_start: Expr, alloc_h: Expr, free_end: Expr, free_h: Expr, name: str
    ) -> cp_model.IntVar:
        """ceil(lifetime / T) copies of a buffer: (free_h - alloc_h) + q, q T >= end - start."""
        m, T = self.m, self.T  # noqa: N806
        c1, c2, c3 = (m.new_bool_var(f"q{i}_{name}") for i in range(3))
        m.add_implication(c2, c1)
        m.add_implication(c3, c2)
        diff = free_end - alloc_start
        m.add(diff <= -T).only_enforce_if(c1.Not())
        m.add(diff <= 0).only_enforce_if(c2.Not())
        m.add(diff <= T).only_enforce_if(c3.Not())
        cnt = m.new_int_var(0, self.maxh + 3, f"copies_{name}")
        m.add(cnt >= free_h - alloc_h - 1 + c1 + c2 + c3)
        return cnt

    def _buffer_memory(self) -> list[Expr]:
        """(22), (34)-(35): per GPU, the reserved copies of the communication buffers it holds."""
        m, L, dc, inst, mem = self.m, self.L, self.dc, self.inst, self.grid.mem  # noqa: N806
        start, d, h, hc, cstart, cend = self.start, self.d, self.h, self.hc, self.cstart, self.cend
        bidx = [2 * L - 1 - k for k in range(L)]
        buffers: list[
            tuple[int, int, cp_model.IntVar, int]
        ] = []  # (stage whose GPU holds it, bytes, count, k)
        for k in range(1, L):
            jx = k - 1  # task F_{k-1}; transfer x[k] after it
            jg = 2 * L - 1 - k  # task B_k; transfer g[k] after it
            if jx in dc and dc[jx] >= 0:
                cnt = self._reserved(
                    cstart[jx], hc[jx], start[bidx[k]] + d[bidx[k]], h[bidx[k]], f"x{k}"
                )
                buffers.append((k, mem(inst.x_size[k]), cnt, k))
                cnt = self._reserved(
                    cstart[jg],
                    hc[jg],
                    start[bidx[k - 1]] + d[bidx[k - 1]],
                    h[bidx[k - 1]],
                    f"gr{k}",
                )
                buffers.append((k - 1, mem(inst.g_size[k]), cnt, k))
                cnt = self._reserved(start[jg], h[jg], cend[jg], hc[jg], f"gs{k}")
                buffers.append((k, mem(inst.g_size[k]), cnt, k))
        bufmem: list[Expr] = []
        for g in range(self.P):
            terms: list[Expr] = []
            for owner, size, cnt, k in buffers:
                if size == 0:
                    continue
                bc = m.new_int_var(0, self.maxh + 3, f"buf_{owner}_{k}_{g}_{len(terms)}")
                m.add(bc >= cnt).only_enforce_if([self.x[owner][g], self.cross[k]])
                terms.append(size * bc)
            bufmem.append(sum(terms))
        return bufmem

    def memory(self) -> None:
        """(31)-(33), (36), Lemma 10: at the start of every task, static weights, buffers,
        stashes, same-GPU gradients and the task's overhead fit in the budget.
        """
        m, L, inst, mem = self.m, self.L, self.inst, self.grid.mem  # noqa: N806
        start, d, h, x, budget = self.start, self.d, self.h, self.x, self.budget
        fidx = list(range(L))
        bidx = [2 * L - 1 - k for k in range(L)]
        stash = [mem(s) for s in inst.stash]
        grad = [mem(inst.g_size[k + 1]) for k in range(L)]  # g[k+1], input of B_k
        copies = static_factor(inst.optimizer, 2)
        weight = [mem(copies * int(w)) for w in inst.weights]
        f_over = [mem(o) for o in inst.f_overhead]
        b_over = [mem(o) for o in inst.b_overhead]
        bufmem = self._buffer_memory()
        for j in range(self.n):
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
                    lg = m.new_int_var(0, self.maxh + 3, f"lg_{k}_{j}")
                    m.add(lg >= h[bidx[k]] - h[bidx[k + 1]] + r - q).only_enforce_if(
                        self.same[k, k + 1]
                    )
                    term = term + grad[k] * lg
                cell = m.new_int_var(0, budget, f"mem_{k}_{j}")
                if k == s:
                    m.add(cell >= term)
                else:
                    m.add(cell >= term).only_enforce_if(self.same[k, s])
                live_terms.append(cell)
            over = f_over[s] if kind == "F" else b_over[s]
            for g in range(self.P):
                static = sum(weight[k] * x[k][g] for k in range(L))
                m.add(sum(live_terms) + over + static + bufmem[g] <= budget).only_enforce_if(
                    x[s][g]
                )


def complete_hint(im: IlpModel, inst: PipelineInstance, plan: PipelinePlan) -> bool:
    """Hint every decision variable from a contiguous 1F1B plan, re-timed on the integer grid.

    The plan's orders and shifts are timed again with the ILP's rounded-up durations (so the times
    are integers and the pattern fits them), normalized to ends in ``(0, T]``, and given the least
    index shifts its times allow (Lemma 9), which never need more memory than the plan's own.
    """
    model, v, u, d, dc = im.model, im.vars, im.u, im.d, im.dc
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
        key = _transfer_after(L, j)
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


def hint_plan(im: IlpModel, plan: PipelinePlan, L: int) -> None:  # noqa: N803
    """Hints from a plan: GPUs renumbered by first use, times rounded to units with ends in [0, T]."""
    model, v, u, d, dc = im.model, im.vars, im.u, im.d, im.dc
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
        key = _transfer_after(L, j)
        if key in comms:
            end = int(round(comms[key] / u)) + dur
            model.add_hint(v.cstart[j], (end % T) - dur if end % T else T - dur)


def read_plan(solver: cp_model.CpSolver, im: IlpModel, inst: PipelineInstance) -> PipelinePlan:
    """The pattern of a solution, in ms with the profile's exact durations."""
    v, u, dc = im.vars, im.u, im.dc
    L = inst.length
    y = [int(solver.value(var)) for var in v.y]
    T = int(solver.value(v.T))
    ops: list[CompOp] = []
    for j in range(2 * L):
        kind, k = _task(L, j)
        a = solver.value(v.start[j]) * u
        dur = inst.forward[k] if kind == "F" else inst.backward[k]
        ops.append((kind, k, a, a + float(dur), int(solver.value(v.h[j]))))
    transfers: list[CommOp] = []
    for j in dc:
        tensor, k = _transfer_after(L, j)
        if y[k - 1] == y[k]:
            continue
        src, dst = (y[k - 1], y[k]) if tensor == "x" else (y[k], y[k - 1])
        a = solver.value(v.cstart[j]) * u
        size = inst.x_size[k] if tensor == "x" else inst.g_size[k]
        transfers.append(
            (tensor, k, src, dst, a, a + inst.transfer_time(size), int(solver.value(v.hc[j])))
        )
    return PipelinePlan(y, T * u, ops, transfers, r=1, versions=2)
