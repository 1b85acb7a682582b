"""Exhaustive-search oracle for the combined model of docs/combined.md (written from it only).

Search space
------------
Every *event-driven* combined schedule of a chain: the computations ``F_all``, ``F_ck``, ``F_n``,
``B`` on the compute stream, and whole-tensor transfers (``offload`` of a stored tensor ``x[k]`` or
``s[k]`` on the GPU, ``prefetch`` of one on the host) on one channel, one at a time, any number of
them, each lasting ``bytes / bandwidth``. Event-driven: every operation starts at time 0 or at the
instant another one ends (a stream may also stay idle until the next end). Forwards are limited to
stages ``k <= b`` (``b`` the next backward; a forward above it is never useful). Every rule of
docs/combined.md is applied (persistency, T2 deferred frees, T4 no free in flight), and the memory
(static excluded) must stay within the budget at every start.

A state is the place of every stored tensor (none, GPU, host, leaving, offloading, prefetching),
the next backward ``b``, the fresh checkpoint (persistency), the running computation and the
running transfer with their remaining times. Dijkstra on the time (starting an operation costs 0,
advancing to the next end costs the time until it) gives the least makespan of the search space.
Use it on chains of at most 4 stages with integer durations.
"""

from __future__ import annotations

import heapq
import itertools

from memplan.profile.model import Profile
from memplan.schedule import Op

NONE, GPU, HOST, LEAVING, OUT, IN = range(6)


class CombinedOracle:
    """Least makespan over event-driven combined schedules (module docstring) of one profile."""

    def __init__(self, profile: Profile, bandwidth: float) -> None:
        st = profile.stages
        self.L = L = len(st)
        self.size = [profile.input_size] + [s.output_size for s in st] + [s.saved_size for s in st]
        self.g = [0] + [s.gradient_size for s in st]
        self.fo = [s.forward_overhead for s in st]
        self.bo = [s.backward_overhead for s in st]
        self.ft = [s.forward_time for s in st]
        self.bt = [s.backward_time for s in st]
        self.per_ms = bandwidth / 1000.0
        self.names = [f"x[{k}]" for k in range(L + 1)] + [f"s[{k}]" for k in range(L)]

    def x(self, k: int) -> int:
        return k

    def s(self, k: int) -> int:
        return self.L + 1 + k

    def held(self, places, b, comp) -> int:
        total = sum(
            size for size, p in zip(self.size, places, strict=True) if p in (GPU, LEAVING, OUT, IN)
        )
        total += self.g[b + 1]
        if comp is not None:
            total += self.transient(comp[0], comp[1])
        return total

    def transient(self, name: str, k: int) -> int:
        if name == "B":
            return self.g[k] + self.bo[k]
        out = self.size[self.s(k)] if name == "F_all" else self.size[self.x(k + 1)]
        return out + self.fo[k]

    def reads(self, name: str, k: int) -> set[int]:
        found = {self.x(k)} | ({self.s(k - 1)} if k > 0 else set())
        return found | ({self.s(k)} if name == "B" else set())

    def _computations(self, places, b, fresh):
        def available(k):
            return places[self.x(k)] in (GPU, OUT) or (
                k > 0 and places[self.s(k - 1)] in (GPU, OUT)
            )

        if b >= 0 and places[self.s(b)] in (GPU, OUT) and available(b):
            yield "B", b
        for k in range(b + 1):
            if not available(k):
                continue
            if places[self.s(k)] == NONE:
                yield "F_all", k
            if places[self.x(k + 1)] == NONE:
                yield "F_ck", k
                p = places[self.x(k)]
                if p == NONE or (fresh == k and p in (GPU, HOST)):
                    yield "F_n", k

    def _end_computation(self, places, b, comp):
        """Places, b, fresh after ``comp`` ends, or None if it frees a tensor in flight."""
        name, k, _ = comp
        places = list(places)
        for t in range(len(places)):
            if places[t] == LEAVING:
                places[t] = HOST
        fresh = k + 1 if name in ("F_ck", "F_n") else -1
        drops = []
        if name == "F_all":
            places[self.s(k)] = GPU
        elif name == "B":
            b -= 1
            drops = [self.s(k), self.x(k)]
        else:
            places[self.x(k + 1)] = GPU
            if name == "F_n":
                drops = [self.x(k)]
        for t in drops:
            if places[t] in (OUT, IN):
                return None
            places[t] = NONE
        return tuple(places), b, fresh

    def solve(self, memory: int) -> tuple[float, list[Op]] | None:
        """Least makespan within ``memory`` bytes (static excluded) and one schedule reaching it.

        Returns None when no schedule of the search space fits.
        """
        places0 = [NONE] * len(self.size)
        places0[0] = GPU
        start = (tuple(places0), self.L - 1, -1, None, None)
        if self.held(start[0], start[1], None) > memory:
            return None
        counter = itertools.count()
        suffix = [0.0]  # suffix[b + 1]: backward time of stages 0..b, still to run
        for k in range(self.L):
            suffix.append(suffix[-1] + self.bt[k])

        def remaining(state) -> float:
            """A* heuristic: compute time of the backwards not yet finished (consistent)."""
            _, b, _, comp, _ = state
            if comp is not None and comp[0] == "B":
                return comp[2] + suffix[b]
            return suffix[b + 1]

        heap = [(remaining(start), next(counter), start)]
        closed: set = set()
        best = {start: 0.0}
        parent: dict = {start: None}
        while heap:
            _, _, state = heapq.heappop(heap)
            if state in closed:
                continue
            closed.add(state)
            t = best[state]
            places, b, fresh, comp, xfer = state
            if b < 0 and comp is None and xfer is None:
                return t, self._rebuild(parent, state)
            moves = []
            if comp is None:
                for name, k in self._computations(places, b, fresh):
                    c = (name, k, self.bt[k] if name == "B" else self.ft[k])
                    if self.held(places, b, c) <= memory:
                        moves.append((0.0, (places, b, fresh, c, xfer), ("start", name, k, None)))
            if xfer is None:
                for tid, p in enumerate(places):
                    if p == GPU:
                        new = list(places)
                        new[tid] = OUT
                        nxt = (
                            tuple(new),
                            b,
                            fresh,
                            comp,
                            ("offload", tid, self.size[tid] / self.per_ms),
                        )
                        moves.append((0.0, nxt, ("start", "offload", tid, None)))
                    elif p == HOST:
                        new = list(places)
                        new[tid] = IN
                        if self.held(new, b, comp) <= memory:
                            nxt = (
                                tuple(new),
                                b,
                                fresh,
                                comp,
                                ("prefetch", tid, self.size[tid] / self.per_ms),
                            )
                            moves.append((0.0, nxt, ("start", "prefetch", tid, None)))
            if comp is not None or xfer is not None:
                step = min(r[2] for r in (comp, xfer) if r is not None)
                nxt = self._advance(state, step)
                if nxt is not None:
                    moves.append((step, nxt, ("advance", step)))
            for cost, nxt, how in moves:
                when = t + cost
                if when < best.get(nxt, float("inf")):
                    best[nxt] = when
                    parent[nxt] = (state, how, t)
                    heapq.heappush(heap, (when + remaining(nxt), next(counter), nxt))
        return None

    def _advance(self, state, step):
        places, b, fresh, comp, xfer = state
        comp_done = comp is not None and comp[2] <= step
        xfer_done = xfer is not None and xfer[2] <= step
        places = list(places)
        if xfer_done:
            kind, tid, _ = xfer
            if kind == "prefetch":
                places[tid] = GPU
            elif comp is not None and tid in self.reads(comp[0], comp[1]) and not comp_done:
                places[tid] = LEAVING
            else:
                places[tid] = HOST
            xfer = None
        elif xfer is not None:
            xfer = (xfer[0], xfer[1], xfer[2] - step)
        places = tuple(places)
        if comp_done:
            ended = self._end_computation(places, b, comp)
            if ended is None:
                return None
            places, b, fresh = ended
            comp = None
        elif comp is not None:
            comp = (comp[0], comp[1], comp[2] - step)
        return (places, b, fresh, comp, xfer)

    def _rebuild(self, parent, state) -> list[Op]:
        starts = []
        while parent[state] is not None:
            prev, how, t = parent[state]
            if how[0] == "start":
                starts.append((t, how[1], how[2]))
            state = prev
        ops = []
        for t, name, k in reversed(starts):
            if name in ("offload", "prefetch"):
                tensor = self.names[k]
                stage = int(tensor[2:-1])
                duration = self.size[k] / self.per_ms
                ops.append(
                    Op(
                        op=name,
                        stage=min(stage, self.L - 1),
                        start=t,
                        end=t + duration,
                        stream="transfer",
                        tensor=tensor,
                    )
                )
            else:
                duration = self.bt[k] if name == "B" else self.ft[k]
                ops.append(Op(op=name, stage=k, start=t, end=t + duration))
        return ops


def window_model_optimum(profile: Profile, memory: int, bandwidth: float) -> float | None:
    """Least makespan over the whole-tensor *window* plans pofo builds (docs/algorithms.md, pofo).

    Search space, enumerated exhaustively: every split of the chain into top-level segments
    (``F_all a``, or ``F_ck a, F_n a+1 .. j-1`` keeping ``x[j]``) followed by a tail ``a..L-1``;
    for each segment, whether its input tensor is offloaded (whole, during the segment's forward,
    the computations waiting at the end for the transfer) and then prefetched (during the next
    segment's backward, reserving its bytes from that backward's start, the computations waiting
    at its end). The recomputation of a segment (``a..j-1`` with ``g[j]`` held) and the tail are
    the least-makespan persistent chain plans found by :class:`ChainOracle` (Dijkstra) on the
    sub-chain, with the memory left by the top-level tensors. Budgets in bytes, no slots.
    """
    from tests.oracles.exhaustive import ChainOracle

    st = profile.stages
    L = len(st)
    x = [profile.input_size] + [s.output_size for s in st]
    s_ = [s.saved_size for s in st]
    g = [0] + [s.gradient_size for s in st]
    per_ms = bandwidth / 1000.0
    cache: dict = {}

    def sub_optimum(a: int, b: int, room: int) -> float:
        """Persistent chain optimum of stages a..b (x[a] counted in ``room``, g[b+1] held)."""
        key = (a, b, room)
        if key not in cache:
            # The sub-chain's first backward produces g[a] (0 in a chain of its own): count it
            # as backward overhead, the last operation of the sub-chain.
            first = st[a].model_copy(update={"backward_overhead": st[a].backward_overhead + g[a]})
            stages = [first] + list(st[a + 1 : b + 1])
            sub = profile.model_copy(update={"input_size": x[a], "stages": stages})
            found = ChainOracle(sub).optimal_makespan(room)
            cache[key] = float("inf") if found is None else found[0]
        return cache[key]

    def value(a: int, kept: int, t: int, p: int | None) -> float:
        """From segment a: ``kept`` bytes of earlier tensors, input of ``t`` bytes, ``p``: bytes
        of the earlier tensor to prefetch during this segment's backward."""
        pf = 0 if p is None else p
        pf_time = pf / per_ms if p is not None else 0.0
        room = memory - kept - t - pf  # for the backward, besides the input
        best = float("inf")
        tail = sub_optimum(a, L - 1, room + x[a])
        best = min(best, tail + max(0.0, pf_time - tail))
        for off in (False, True):
            if off and per_ms <= 0:
                continue
            kept2 = kept if off else kept + t
            p2 = t if off else None
            off_time = t / per_ms if off else 0.0
            fwd = memory - kept - t - g[L]
            fits = a < L - 1 and s_[a] + st[a].forward_overhead <= fwd
            if fits and g[a + 1] + s_[a] + g[a] + st[a].backward_overhead <= room:
                ft, bt = st[a].forward_time, st[a].backward_time
                sub = value(a + 1, kept2, s_[a], p2)
                best = min(best, ft + max(0.0, off_time - ft) + sub + bt + max(0.0, pf_time - bt))
            need = x[a + 1] + st[a].forward_overhead
            for j in range(a + 1, L):
                if j > a + 1:
                    need = max(need, x[j - 1] + x[j] + st[j - 1].forward_overhead)
                if need > fwd:
                    break
                back = sub_optimum(a, j - 1, room + x[a])
                if back == float("inf"):
                    continue
                window = sum(st[k].forward_time for k in range(a, j))
                sub = value(j, kept2, x[j], p2)
                best = min(
                    best,
                    window + max(0.0, off_time - window) + sub + back + max(0.0, pf_time - back),
                )
        return best

    # x[0] is counted in ``memory`` here: the input's bytes are the top-level tensor of segment 0.
    result = value(0, 0, x[0], None)
    return None if result == float("inf") else result
