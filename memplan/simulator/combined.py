"""Replay a combined schedule: recomputation and offloading together (docs/combined.md).

This module is the independent check of the combined family (papers/000, POFO): it shares no
code with :mod:`memplan.algorithms` and must not import it. The model is the chain model of
docs/model.md (``F_all``, ``F_ck``, ``F_n``, ``B`` with memory persistency) plus transfers of
stored tensors (``x[k]`` and ``s[k]``) on one channel, as in docs/offload.md: an offload frees
the GPU copy when it ends (later if the running computation reads the tensor), a prefetch
reserves the tensor's memory when it starts, one transfer at a time, ``bytes / bandwidth`` each.

Without transfers the replay is that of :func:`memplan.simulator.simulate_chain`; with every
forward ``F_all`` it is that of :func:`memplan.simulator.simulate_offload` (checked by
tests/simulator/test_combined.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from memplan.profile.model import Profile
from memplan.schedule import Op
from memplan.simulator.chain import TIME_TOLERANCE, SimulationResult, lasts, same_instant

COMPUTE_OPS = ("F_all", "F_ck", "F_n", "B")
TRANSFER_OPS = ("offload", "prefetch")
_TENSOR = re.compile(r"^([xs])\[(\d+)\]$")

# Places of a stored tensor (docs/combined.md, table "place").
_GPU, _OUT, _LEAVING, _HOST, _IN = "gpu", "offloading", "leaving", "host", "prefetching"
_ON_GPU = (_GPU, _OUT)  # available to a computation


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TIME_TOLERANCE, abs_tol=TIME_TOLERANCE)


def _instants(times: Sequence[float]) -> dict[float, float]:
    """Map each time to the first time of its cluster (times at one instant: :func:`same_instant`)."""
    instant: dict[float, float] = {}
    last = None
    for when in sorted(set(times)):
        if last is not None and same_instant(when, last):
            instant[when] = last
        else:
            instant[when] = when
            last = when
    return instant


class _State:
    """Places of the stored tensors and the bytes on the GPU during a replay."""

    def __init__(self, profile: Profile) -> None:
        st = profile.stages
        self.length = len(st)
        self.size = {"x[0]": profile.input_size}
        for k, stage in enumerate(st):
            self.size[f"x[{k + 1}]"] = stage.output_size
            self.size[f"s[{k}]"] = stage.saved_size
        self.g = [0] + [stage.gradient_size for stage in st]
        self.fo = [stage.forward_overhead for stage in st]
        self.bo = [stage.backward_overhead for stage in st]
        self.place: dict[str, str | None] = dict.fromkeys(self.size)
        self.place["x[0]"] = _GPU
        self.held = profile.input_size + self.g[self.length]  # bytes on the GPU
        self.next_backward = self.length - 1
        self.fresh = -1  # k of the standalone x[k] the previous computation produced
        self.running: tuple[str, int] | None = None
        self.leaving: list[str] = []  # offloaded, freed at the end of the running computation

    def available(self, k: int) -> bool:
        return self.place[f"x[{k}]"] in _ON_GPU or (k > 0 and self.place[f"s[{k - 1}]"] in _ON_GPU)

    def reads(self, name: str, k: int) -> tuple[str, ...]:
        """Tensors computation ``name k`` reads (they stay on the GPU while it runs)."""
        inputs = (f"x[{k}]",) + ((f"s[{k - 1}]",) if k > 0 else ())
        return inputs + ((f"s[{k}]",) if name == "B" else ())

    def problem(self, name: str, k: int) -> str | None:
        """Why computation ``name`` cannot start on stage ``k`` now (docs/model.md + T4)."""
        if name == "B":
            if self.next_backward < 0:
                return "every backward has already run"
            if k != self.next_backward:
                return f"backward out of order: the next backward is B stage {self.next_backward}"
            if self.place[f"s[{k}]"] not in _ON_GPU:
                where = self.place[f"s[{k}]"]
                return f"s[{k}] is not on the GPU" + (f" (it is {where})" if where else "")
        elif name == "F_all":
            if self.place[f"s[{k}]"] is not None:
                return f"s[{k}] is already held ({self.place[f's[{k}]']})"
        else:
            out, inp = f"x[{k + 1}]", f"x[{k}]"
            if self.place[out] is not None:
                return f"{out} is already held ({self.place[out]})"
            if name == "F_n" and self.place[inp] is not None:
                if self.fresh != k:
                    return (
                        f"would free the stored checkpoint {inp} (memory persistency: F_n may "
                        "only consume the activation the previous operation produced; use F_ck)"
                    )
                if self.place[inp] not in (_GPU, _HOST):
                    return f"would free {inp} while it is {self.place[inp]}"
        if not self.available(k):
            if k == 0:
                return "x[0] is not on the GPU"
            return f"x[{k}] is not on the GPU (neither x[{k}] nor s[{k - 1}] is there)"
        return None

    def transient(self, name: str, k: int) -> int:
        """Bytes reserved at the start of a computation: its output (or g[k]) and overhead."""
        if name == "B":
            return self.g[k] + self.bo[k]
        out = self.size[f"s[{k}]"] if name == "F_all" else self.size[f"x[{k + 1}]"]
        return out + self.fo[k]

    def drop(self, tensor: str) -> str | None:
        """Free a tensor wherever it is (T4); a problem if its offload is in flight."""
        where = self.place[tensor]
        if where in (_OUT, _IN):
            return f"frees {tensor} while it is {where}"
        if where in (_GPU, _LEAVING):
            self.held -= self.size[tensor]
        self.place[tensor] = None
        if tensor in self.leaving:
            self.leaving.remove(tensor)
        return None

    def finish(self, name: str, k: int) -> str | None:
        """End of a computation: keep its output, free its overhead and what it frees."""
        self.held -= self.bo[k] if name == "B" else self.fo[k]
        for tensor in self.leaving:
            self.held -= self.size[tensor]
            self.place[tensor] = _HOST
        self.leaving = []
        self.running = None
        self.fresh = k + 1 if name in ("F_ck", "F_n") else -1
        if name == "F_all":
            self.place[f"s[{k}]"] = _GPU
            return None
        if name == "B":
            self.held -= self.g[k + 1]
            self.next_backward -= 1
            for tensor in (f"s[{k}]", f"x[{k}]"):
                problem = self.drop(tensor)
                if problem:
                    return problem
            return None
        self.place[f"x[{k + 1}]"] = _GPU
        if name == "F_n" and self.place[f"x[{k}]"] is not None:
            return self.drop(f"x[{k}]")
        return None


def simulate_combined(
    profile: Profile,
    ops: Sequence[Op],
    *,
    static_memory: int = 0,
    memory: int | None = None,
    bandwidth: float,
) -> SimulationResult:
    """Replay a combined schedule (docs/combined.md) and report makespan, idle time, peak.

    Parameters
    ----------
    profile : Profile
        The chain the schedule was made for.
    ops : sequence of Op
        Computations ``F_all``/``F_ck``/``F_n``/``B`` on stream ``compute`` (in execution order)
        and transfers ``offload``/``prefetch`` on stream ``transfer`` naming their tensor
        (``x[k]`` or ``s[k]``; default ``s[stage]``), all with start and end times (ms).
    static_memory : int
        Bytes present all the time, added to every figure.
    memory : int, optional
        Budget, static memory included.
    bandwidth : float
        Host<->device bandwidth, bytes/s; a transfer of ``b`` bytes lasts ``b / bandwidth`` s.

    Returns
    -------
    SimulationResult
        ``makespan`` (end of the last operation), ``idle_time`` (makespan minus compute time),
        ``peak_memory``, ``op_peaks`` (one per computation), and the first ``violation``. A model
        violation stops the replay; a memory violation does not.
    """
    state = _State(profile)
    length = state.length
    result = SimulationResult(static_memory=static_memory, budget=memory)
    per_ms = bandwidth / 1000.0
    compute: list[int] = []
    transfers: list[int] = []
    tensors: dict[int, str] = {}
    busy = 0.0
    # 1. Each operation on its own, and the order on the compute stream.
    previous_end = 0.0
    for index, op in enumerate(ops):
        where = f"ops[{index}] {op.op} stage {op.stage}"
        if not 0 <= op.stage < length:
            result.fail(f"{where}: no such stage (the profile has {length} stages)", index)
            return result
        if op.op in COMPUTE_OPS:
            if op.stream != "compute" or op.tensor is not None:
                result.fail(f"{where}: computations run on stream 'compute', name no tensor", index)
                return result
            st = profile.stages[op.stage]
            duration = st.backward_time if op.op == "B" else st.forward_time
            if op.start < previous_end and not _close(op.start, previous_end):
                result.fail(f"{where}: starts at {op.start}, before the previous end", index)
                return result
            previous_end = op.end
            compute.append(index)
            busy += duration
        else:
            if op.stream != "transfer":
                result.fail(f"{where}: transfers run on stream 'transfer'", index)
                return result
            name = op.tensor if op.tensor is not None else f"s[{op.stage}]"
            match = _TENSOR.match(name)
            if match is None or name not in state.size:
                result.fail(f"{where}: no such stored tensor {name!r} (x[0..L] or s[0..L-1])")
                return result
            tensors[index] = name
            transfers.append(index)
            duration = state.size[name] / per_ms
        if op.start < 0 and not _close(op.start, 0.0):
            result.fail(f"{where}: starts before time 0", index)
            return result
        if not lasts(op.start, op.end, duration):
            result.fail(
                f"ops[{index}].end: {op.end} != start {op.start} + duration {duration}", index
            )
            return result
    # 2. One transfer at a time (T1).
    channel = sorted(transfers, key=lambda i: (ops[i].start, i))
    for before, after in zip(channel, channel[1:], strict=False):
        if ops[after].start < ops[before].end and not _close(ops[after].start, ops[before].end):
            result.fail(
                f"ops[{after}] {ops[after].op} {tensors[after]}: starts at {ops[after].start}, "
                f"while ops[{before}] still uses the channel (one transfer at a time)",
                after,
            )
            return result
    # 3. Events in time (T5): at one instant, the ends of operations that lasted (transfers first)
    # come before the starts, which take effect in schedule order, a zero-duration operation
    # starting and ending in its place (a prefetch listed after a zero-duration computation of the
    # same instant starts after it ends, as in the offloading simulator).
    instant = _instants([t for op in ops for t in (op.start, op.end)])
    events = []
    for position, index in enumerate(compute + channel):
        op = ops[index]
        start, end = instant[op.start], instant[op.end]
        events.append((start, 1, index, 0, 0, index))
        if end == start:
            events.append((start, 1, index, 1, 1, index))
        else:
            events.append((end, 0, int(op.op in COMPUTE_OPS), position, 1, index))
    events.sort()
    peak = static_memory + state.held
    op_peak: int | None = None
    result.memory_curve.append((0.0, peak))
    for when, _, _, _, is_end, index in events:
        op = ops[index]
        where = f"ops[{index}] {op.op} stage {op.stage}"
        problem: str | None = None
        if op.op in COMPUTE_OPS:
            if not is_end:
                problem = state.problem(op.op, op.stage)
                if problem is None:
                    state.running = (op.op, op.stage)
                    state.held += state.transient(op.op, op.stage)
                    op_peak = static_memory + state.held
            else:
                problem = state.finish(op.op, op.stage)
                result.op_peaks.append(op_peak or 0)
                op_peak = None
        else:
            name = tensors[index]
            where = f"ops[{index}] {op.op} {name}"
            place = state.place[name]
            if op.op == "offload" and not is_end:
                if place != _GPU:
                    problem = f"{name} is not on the GPU ({place or 'not held'})"
                else:
                    state.place[name] = _OUT
            elif op.op == "offload":
                if place != _OUT:  # pragma: no cover - a free in flight is caught by drop()
                    problem = f"{name} is {place} at the end of its offload"
                elif state.running and name in state.reads(*state.running):
                    state.place[name] = _LEAVING
                    state.leaving.append(name)
                else:
                    state.place[name] = _HOST
                    state.held -= state.size[name]
            elif not is_end:
                if place != _HOST:
                    problem = f"{name} is not on the host ({place or 'not held'})"
                else:
                    state.place[name] = _IN
                    state.held += state.size[name]
            else:
                state.place[name] = _GPU
        if problem is not None:
            result.fail(f"{where}: {problem}", index)
            break
        now = static_memory + state.held
        result.memory_curve.append((when, now))
        if op_peak is not None and now > op_peak:
            op_peak = now
        if now > peak:
            peak = now
        if memory is not None and now > memory:
            result.fail(f"{where}: memory reaches {now} bytes, budget {memory}", index)
    else:
        if state.next_backward >= 0:
            result.fail(f"incomplete: B stage {state.next_backward} never ran")
    result.peak_memory = peak
    result.makespan = max((op.end for op in ops), default=0.0)
    result.idle_time = max(0.0, result.makespan - busy)
    return result
