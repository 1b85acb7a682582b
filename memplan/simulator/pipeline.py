"""Replay a periodic pipeline pattern over many mini-batches (independent check, Pipelined Model Parallelism (Euro-Par 2021)).

This module shares no code with :mod:`memplan.algorithms` and must not import it. Given a
``pipeline`` schedule (``assignment``, ``period``, per-GPU ``pattern``, ``transfers``), it:

1. checks the pattern's shape: every ``F k`` and ``B k`` present ``batches_per_period`` times on
   ``assignment[k]``, their shifts covering every mini-batch once, durations equal to the profile's,
   a transfer of ``x[k]`` and of ``g[k]`` exactly where stages ``k-1`` and ``k`` are on different
   GPUs, lasting ``bytes / link_bandwidth``;
2. unrolls the pattern (operation with shift ``s`` in copy ``i`` works on mini-batch ``r i - s`` at
   times shifted by ``i * period``) over enough mini-batches to reach the steady state, checks every
   dependency of every mini-batch (forward chain, loss, backward chain, through the transfers) and
   that no GPU and no link runs two things at once;
3. replays each GPU's memory event by event (allocations and frees of every tensor of the model in
   docs/pipeline.md, NOTE [ pipeline memory model ] in memplan/algorithms/pipeline/model.py) and
   takes the peak of each GPU, static memory included.

``makespan`` is the period (the steady-state time per pattern); ``peak_memory`` the largest GPU
peak; ``gpu_peaks`` each GPU's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from memplan.profile.model import Profile, Stage
from memplan.schedule import OPTIMIZER_FACTORS, Schedule
from memplan.simulator.claims import optimizer_of
from memplan.simulator.result import SimulationResult, over_budget

TOLERANCE = 1e-6
"""Absolute tolerance (ms) of the timing checks (relative to the period for large values)."""

GRID = 1e-7
"""ms: event times are snapped to this grid before ordering frees and allocations."""

MAX_UNROLLED = 10_000_000
"""The most operations the replay unrolls (mini-batches x operations of the pattern). A pattern
whose shifts or times are spread over so many periods that it needs more is refused before
anything is unrolled (a tampered ``shift: 100000000`` needed 15 GB)."""


@dataclass
class PipelineSimulationResult(SimulationResult):
    """A :class:`SimulationResult` with each GPU's peak (bytes) and the replayed mini-batches."""

    gpu_peaks: list[int] = field(default_factory=list)
    batches: int = 0


def simulate_pipeline(
    profile: Profile, schedule: Schedule, memory: int | None = None
) -> PipelineSimulationResult:
    """Replay ``schedule`` (family ``pipeline``) on ``profile``; ``memory`` is the per-GPU budget."""
    result = PipelineSimulationResult(budget=memory)
    try:
        _replay(profile, schedule, memory, result)
    except _Invalid as exc:
        result.fail(str(exc))
    return result


_Times = tuple[np.ndarray, np.ndarray]
"""Start and end of one operation or transfer for each mini-batch."""
_Spans = dict[tuple[str, int], list[tuple[float, float, int]]]
"""Per operation or transfer ``(kind, stage)``: its ``(start, end, shift)`` in the pattern."""


class _Invalid(Exception):
    pass


def _tol(period: float) -> float:
    return TOLERANCE * max(1.0, period)


def _replay(
    profile: Profile, sched: Schedule, memory: int | None, result: PipelineSimulationResult
) -> None:
    stages = profile.stages
    if stages is None:
        raise _Invalid("the pipeline simulator needs a chain profile (stages)")
    L = len(stages)
    assign = sched.assignment
    period = sched.period
    r = sched.batches_per_period or 1
    if assign is None or period is None or sched.pattern is None:
        raise _Invalid("a pipeline schedule needs assignment, period and pattern")
    if len(assign) != L:
        raise _Invalid(f"assignment: {len(assign)} entries for {L} stages")
    if not period > 0:
        raise _Invalid(f"period: expected > 0, got {period}")
    gpus = sched.budget.gpus
    if gpus is not None and max(assign) >= gpus:
        raise _Invalid(f"assignment uses GPU {max(assign)} but only {gpus} GPUs are given")
    if gpus is None and max(assign) >= L:  # L stages use at most L GPUs: 0 .. L-1 name them
        raise _Invalid(
            f"assignment uses GPU {max(assign)}: without budget.gpus, GPUs are numbered from 0 "
            f"to {L - 1} (one per stage at most)"
        )
    tol = _tol(period)
    fwd = [st.forward_time for st in stages]
    bwd = [st.backward_time for st in stages]
    _check_load(sched, fwd, bwd, period, r, tol)

    # -- 1. shape of the pattern: op (F/B, k) -> list of (start, end, shift)
    comp = _compute_spans(sched, assign, fwd, bwd, r, tol)
    comm, comm_link = _transfer_spans(sched, stages, assign, r, tol)

    # -- 2. unroll over N mini-batches (bounded first: MAX_UNROLLED)
    N = _mini_batches(sched, comp, comm, period, r)
    result.batches = N
    m = np.arange(N)

    def times(table: _Spans, key: tuple[str, int]) -> tuple[np.ndarray, np.ndarray]:
        """Start and end of ``key`` for mini-batches 0..N-1."""
        start = np.empty(N)
        end = np.empty(N)
        for a, b, s in table[key]:
            # batch m = r i - s  <=>  i = (m + s) / r
            sel = (m + s) % r == 0
            i = (m[sel] + s) // r
            start[sel] = a + i * period
            end[sel] = b + i * period
        return start, end

    F = [times(comp, ("F", k)) for k in range(L)]
    B = [times(comp, ("B", k)) for k in range(L)]
    X = {k: times(comm, ("x", k)) for k in range(1, L) if assign[k - 1] != assign[k]}
    G = {k: times(comm, ("g", k)) for k in range(1, L) if assign[k - 1] != assign[k]}

    _check_order(F, B, X, G, tol)
    used = sorted(set(assign))
    _check_exclusive(assign, used, F, B, X, G, comm_link, tol)

    # -- 3. memory per GPU
    per_weight, peaks = _gpu_memory(profile, sched, assign, used, F, B, X, G)
    gpu_peaks = [0] * (max(used) + 1)
    for g, p in zip(used, peaks, strict=True):
        gpu_peaks[g] = int(p)
    result.gpu_peaks = gpu_peaks
    result.peak_memory = int(max(peaks))
    result.static_memory = int(per_weight * profile.weight_size)
    result.makespan = float(period)
    busy = sum(fwd) + sum(bwd)
    result.idle_time = float(len(used) * period * r - r * busy) / r
    if memory is not None:
        for g, p in zip(used, peaks, strict=True):
            if p > memory:
                raise _Invalid(f"GPU {g}: {over_budget(int(p), memory)} per GPU")


def _compute_spans(
    sched: Schedule, assign: list[int], fwd: list[float], bwd: list[float], r: int, tol: float
) -> _Spans:
    """The pattern's computations, checked against the profile and the assignment."""
    L = len(fwd)
    assert sched.pattern is not None  # checked by the caller
    comp: _Spans = {}
    for gp in sched.pattern:
        for op in gp.ops:
            where = f"pattern gpu {gp.gpu} {op.op} stage {op.stage}"
            if op.stage >= L:
                raise _Invalid(f"{where}: no such stage")
            if assign[op.stage] != gp.gpu:
                raise _Invalid(f"{where}: stage {op.stage} is assigned to GPU {assign[op.stage]}")
            want = fwd[op.stage] if op.op == "F" else bwd[op.stage]
            if abs((op.end - op.start) - want) > tol:
                raise _Invalid(f"{where}: lasts {op.end - op.start} ms, the profile says {want}")
            comp.setdefault((op.op, op.stage), []).append((op.start, op.end, op.shift))
    for kind in ("F", "B"):
        for k in range(L):
            _check_cover(comp.get((kind, k), []), r, f"{kind} stage {k}")
    return comp


def _transfer_spans(
    sched: Schedule, stages: list[Stage], assign: list[int], r: int, tol: float
) -> tuple[_Spans, dict[tuple[str, int], tuple[int, int]]]:
    """The pattern's transfers, checked against the profile and the assignment, and the link of
    each one.
    """
    L = len(stages)
    bw = sched.link_bandwidth
    comm: _Spans = {}
    comm_link: dict[tuple[str, int], tuple[int, int]] = {}
    for tr in sched.transfers or []:
        where = f"transfer {tr.tensor}[{tr.stage}]"
        k = tr.stage
        if k >= L:
            raise _Invalid(f"{where}: no such stage boundary")
        src, dst = (assign[k - 1], assign[k]) if tr.tensor == "x" else (assign[k], assign[k - 1])
        if (tr.src, tr.dst) != (src, dst):
            raise _Invalid(f"{where}: goes {tr.src}->{tr.dst}, the assignment says {src}->{dst}")
        if src == dst:
            raise _Invalid(f"{where}: stages {k - 1} and {k} are on the same GPU")
        size = stages[k - 1].output_size if tr.tensor == "x" else stages[k - 1].gradient_size
        want = 0.0 if bw is None else size / bw * 1e3
        if abs((tr.end - tr.start) - want) > tol:
            raise _Invalid(f"{where}: lasts {tr.end - tr.start} ms, {size} bytes need {want}")
        comm.setdefault((tr.tensor, k), []).append((tr.start, tr.end, tr.shift))
        comm_link[(tr.tensor, k)] = (min(src, dst), max(src, dst))
    for k in range(1, L):
        if assign[k - 1] != assign[k]:
            for t in ("x", "g"):
                _check_cover(comm.get((t, k), []), r, f"transfer {t}[{k}]")
    return comm, comm_link


def _gpu_memory(
    profile: Profile,
    sched: Schedule,
    assign: list[int],
    used: list[int],
    F: list[_Times],
    B: list[_Times],
    X: dict[int, _Times],
    G: dict[int, _Times],
) -> tuple[int, list[int]]:
    """Bytes per weight byte (weights, gradients, optimizer state) and the peak of each GPU of
    ``used``: its weights and the live bytes of its unrolled operations.
    """
    stages = profile.chain_stages
    L = len(stages)
    versions = sched.weight_versions or 2
    factor = OPTIMIZER_FACTORS[optimizer_of(sched)]
    per_weight = factor + versions - 1 if factor > 0 else 0
    events: dict[int, list[tuple[np.ndarray, np.ndarray, int]]] = {g: [] for g in used}

    def hold(g: int, start: np.ndarray, end: np.ndarray, nbytes: int) -> None:
        if nbytes:
            events[g].append((start, end, int(nbytes)))

    x0 = profile.input_size or 0
    for k in range(L):
        g = assign[k]
        st = stages[k]
        hold(g, F[k][0], B[k][1], st.saved_size + (x0 if k == 0 else 0))
        hold(g, F[k][0], F[k][1], st.forward_overhead)
        hold(g, B[k][0], B[k][1], st.backward_overhead)
        if k >= 1 and k in X:
            hold(g, X[k][0], B[k][1], stages[k - 1].output_size)
        if k + 1 < L:
            grad = st.gradient_size
            if k + 1 in G:
                hold(assign[k + 1], B[k + 1][0], G[k + 1][1], grad)
                hold(g, G[k + 1][0], B[k][1], grad)
            else:
                hold(g, B[k + 1][0], B[k][1], grad)
    peaks = []
    for g in used:
        static = per_weight * sum(stages[k].weight_size for k in range(L) if assign[k] == g)
        peaks.append(static + _peak(events[g]))
    return per_weight, peaks


def _after(first: np.ndarray, then: np.ndarray, what: str, tol: float) -> None:
    """Every mini-batch starts ``then`` after ``first`` ends."""
    bad = np.nonzero(then < first - tol)[0]
    if len(bad):
        b = int(bad[0])
        raise _Invalid(f"mini-batch {b}: {what} starts at {then[b]:.6g} before {first[b]:.6g}")


def _check_order(
    F: list[_Times], B: list[_Times], X: dict[int, _Times], G: dict[int, _Times], tol: float
) -> None:
    """Each mini-batch's forwards, then its backwards, with the transfers between GPUs."""
    L = len(F)
    for k in range(1, L):
        if k in X:
            _after(F[k - 1][1], X[k][0], f"transfer x[{k}] (after F {k - 1})", tol)
            _after(X[k][1], F[k][0], f"F {k} (after transfer x[{k}])", tol)
        else:
            _after(F[k - 1][1], F[k][0], f"F {k} (after F {k - 1})", tol)
    _after(F[L - 1][1], B[L - 1][0], f"B {L - 1} (after F {L - 1})", tol)
    for k in range(L - 1, 0, -1):
        if k in G:
            _after(B[k][1], G[k][0], f"transfer g[{k}] (after B {k})", tol)
            _after(G[k][1], B[k - 1][0], f"B {k - 1} (after transfer g[{k}])", tol)
        else:
            _after(B[k][1], B[k - 1][0], f"B {k - 1} (after B {k})", tol)


def _check_exclusive(
    assign: list[int],
    used: list[int],
    F: list[_Times],
    B: list[_Times],
    X: dict[int, _Times],
    G: dict[int, _Times],
    comm_link: dict[tuple[str, int], tuple[int, int]],
    tol: float,
) -> None:
    """One computation at a time on each GPU, one transfer at a time on each link."""
    L = len(F)
    for g in used:
        mine = [k for k in range(L) if assign[k] == g]
        s = np.concatenate([F[k][0] for k in mine] + [B[k][0] for k in mine])
        e = np.concatenate([F[k][1] for k in mine] + [B[k][1] for k in mine])
        _exclusive(s, e, tol, f"GPU {g}")
    links: dict[tuple[int, int], list[_Times]] = {}
    for key, link in comm_link.items():
        t, k = key
        links.setdefault(link, []).append(X[k] if t == "x" else G[k])
    for link, spans in links.items():
        s = np.concatenate([a for a, _ in spans])
        e = np.concatenate([b for _, b in spans])
        _exclusive(s, e, tol, f"link {link[0]}-{link[1]}")


def _check_load(
    sched: Schedule, fwd: list[float], bwd: list[float], period: float, r: int, tol: float
) -> None:
    """Every GPU and link is busy at most ``period`` ms per period (else two copies overlap).

    Checked before the unrolling, this also bounds the period from below by the work of the
    pattern: a ``period: 1e-300`` fails here, naming the GPU, instead of unrolling 10^300 copies.
    """
    assert sched.pattern is not None  # checked by the caller
    for index, gp in enumerate(sched.pattern):
        busy = sum((fwd if op.op == "F" else bwd)[op.stage] for op in gp.ops if op.stage < len(fwd))
        if busy > period + tol:
            raise _Invalid(
                f"pattern[{index}] (GPU {gp.gpu}): its operations take {busy:.6g} ms, more than "
                f"the period {period:.6g} ms"
            )
    links: dict[tuple[int, int], float] = {}
    for tr in sched.transfers or []:
        link = (min(tr.src, tr.dst), max(tr.src, tr.dst))
        links[link] = links.get(link, 0.0) + max(0.0, tr.end - tr.start)
    for (a, b), busy in links.items():
        if busy > period + tol:
            raise _Invalid(
                f"link {a}-{b}: its transfers take {busy:.6g} ms, more than the period "
                f"{period:.6g} ms"
            )


def _mini_batches(sched: Schedule, comp: _Spans, comm: _Spans, period: float, r: int) -> int:
    """How many mini-batches the replay unrolls to reach the steady state (at most MAX_UNROLLED
    operations, else the schedule is invalid, naming its farthest operation).
    """
    entries = [
        (key, a, b, s) for table in (comp, comm) for key, v in table.items() for (a, b, s) in v
    ]
    low = min(entries, key=lambda e: e[3])
    high = max(entries, key=lambda e: e[3])
    first = min(entries, key=lambda e: e[1])
    last = max(entries, key=lambda e: e[2])
    spread = (last[2] - first[1]) / period + (high[3] - low[3]) / r
    keys = len(comp) + len(comm)
    if math.isfinite(spread) and spread < MAX_UNROLLED:
        copies = int(math.ceil(spread)) + 6
        N = r * max(3, 2 * copies + 2)
        if N * keys <= MAX_UNROLLED:
            return N
    if (high[3] - low[3]) / r >= (last[2] - first[1]) / period:
        far, what = high, f"shift {high[3]} (the least shift is {low[3]})"
    else:
        far, what = last, f"end {last[2]:.6g} ms (the first operation starts at {first[1]:.6g} ms)"
    (kind, k) = far[0]
    name = f"transfer {kind}[{k}]" if kind in ("x", "g") else f"{kind} stage {k}"
    raise _Invalid(
        f"{name}: {what} spreads the pattern over {spread:.3g} periods of {period:.6g} ms; "
        f"replaying it would unroll more than {MAX_UNROLLED} operations"
    )


def _check_cover(entries: list[tuple[float, float, int]], r: int, what: str) -> None:
    if len(entries) != r:
        raise _Invalid(f"{what}: appears {len(entries)} times in the pattern, expected {r}")
    residues = sorted((-s) % r for _, _, s in entries)
    if residues != list(range(r)):
        raise _Invalid(f"{what}: its shifts do not cover every mini-batch once")


def _exclusive(start: np.ndarray, end: np.ndarray, tol: float, what: str) -> None:
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    bad = np.nonzero(s[1:] < e[:-1] - tol)[0]
    if len(bad):
        i = int(bad[0])
        raise _Invalid(f"{what}: two operations overlap at {s[i + 1]:.6g} ms")


def _peak(items: list[tuple[np.ndarray, np.ndarray, int]]) -> int:
    """Largest sum of live bytes; lifetimes ``[start, end)`` (a free at t precedes an alloc at t)."""
    if not items:
        return 0
    t = np.concatenate([np.concatenate([s, e]) for s, e, _ in items])
    t = np.round(t / GRID) * GRID  # an end and a start equal up to rounding are the same instant
    d = np.concatenate(
        [np.concatenate([np.full(len(s), n), np.full(len(e), -n)]) for s, e, n in items]
    ).astype(np.int64)
    order = np.lexsort((d, t))  # by time, then frees (negative) first
    return int(max(0, np.cumsum(d[order]).max()))
