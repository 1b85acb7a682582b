"""Replay an offloading schedule event by event (the model of papers/004, docs/offload.md).

This module is the independent check of the offloading algorithms: it shares no code with
:mod:`memplan.algorithms` and must not import it. It reads the timed operations of a schedule
(compute operations ``F_all``/``B`` on stream ``compute``; ``offload``/``prefetch`` on stream
``transfer``), checks every rule of the model, then sweeps the memory over time.

Rules checked
-------------
* compute: every ``F_all`` once in stage order, then every ``B`` once in reverse order, one at a
  time, each lasting its profile time;
* transfers: one at a time, each lasting ``bytes / bandwidth``; a tensor (``x[0]``, the chain
  input, or ``s[k]``, what stage ``k`` saved) is offloaded at most once, after it was produced,
  and then prefetched once, after it has left the GPU and before the first backward that reads it
  (``B k+1`` for ``s[k]``, ``B k`` for ``s[L-1]``, ``B 0`` for ``x[0]``);
* memory, static memory included, at every instant (frees before reservations at equal times):
  ``x[0]`` and ``g[L]`` from time 0; ``s[k]`` and ``forward_overhead[k]`` from the start of
  ``F_all k``; ``g[k]`` and ``backward_overhead[k]`` from the start of ``B k``; a ``B k`` frees
  ``backward_overhead[k]``, ``g[k+1]``, ``s[k]`` (and ``x[0]`` for ``k = 0``) at its end; an
  offloaded tensor leaves the GPU when its offload has ended and the forward that reads it
  (``F_all k+1`` for ``s[k]``, ``F_all 0`` for ``x[0]``) has ended; a prefetch reserves its tensor
  from its start.

The makespan is the end of the last operation; the idle time is the makespan minus the compute
time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memplan.profile.model import Profile
from memplan.schedule import Op
from memplan.simulator.chain import TIME_TOLERANCE, SimulationResult, lasts, same_instant

COMPUTE_OPS = ("F_all", "B")
TRANSFER_OPS = ("offload", "prefetch")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TIME_TOLERANCE, abs_tol=TIME_TOLERANCE)


def _before(a: float, b: float) -> bool:
    """``a <= b`` up to the timing tolerance."""
    return a <= b or _close(a, b)


def _instants(times) -> dict[float, float]:
    """Map each time to the first of the times within the tolerance before it: one instant.

    Solvers compute times with float noise (``0.33333333333333326`` for ``1/3``); events closer
    than the tolerance happen at the same instant, in the order the model gives them.
    """
    instant: dict[float, float] = {}
    last = 0.0
    for when in sorted(set(times)):
        if instant and same_instant(when, last):
            instant[when] = last
        else:
            instant[when] = last = when
    return instant


class _Tensor:
    """One offloadable tensor: its size, when it exists, who reads it, and its transfers."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.offload: int | None = None  # index in ops
        self.prefetch: int | None = None


def simulate_offload(
    profile: Profile,
    ops: Sequence[Op],
    *,
    static_memory: int = 0,
    memory: int | None = None,
    bandwidth: float,
) -> SimulationResult:
    """Replay an offloading schedule and report makespan, idle time, peak memory, first violation.

    Parameters
    ----------
    profile : Profile
        The chain the schedule was made for.
    ops : sequence of Op
        Timed operations (``start``/``end`` in ms).
    static_memory : int
        Bytes present all the time (weights, gradients, optimizer state).
    memory : int, optional
        Budget, static memory included.
    bandwidth : float
        Host<->device bandwidth in bytes per second (transfers last ``bytes / bandwidth``).

    Returns
    -------
    SimulationResult
        After a violation of the model the replay stops; after a timing or memory violation it
        goes on, so that ``makespan`` and ``peak_memory`` are those of the whole schedule.
    """
    result = SimulationResult(static_memory=static_memory, budget=memory)
    stages = profile.stages
    length = len(stages)
    per_ms = bandwidth / 1000.0
    if not per_ms > 0:
        result.fail(f"bandwidth {bandwidth!r}: expected a positive rate")
        return result
    tensors = {"x[0]": _Tensor("x[0]", profile.input_size)}
    for k, st in enumerate(stages):
        tensors[f"s[{k}]"] = _Tensor(f"s[{k}]", st.saved_size)

    # 1. Each operation on its own: name, stage, stream, tensor, duration.
    compute: list[int] = []
    transfers: list[int] = []
    for index, op in enumerate(ops):
        where = f"ops[{index}] {op.op} stage {op.stage}"
        if op.op not in COMPUTE_OPS + TRANSFER_OPS:
            result.fail(
                f"{where}: {op.op} is not an operation of the offloading model "
                "(F_all, B, offload, prefetch)",
                index,
            )
            return result
        if not 0 <= op.stage < length:
            result.fail(
                f"{where}: no such stage (the profile has {length} stages, 0..{length - 1})", index
            )
            return result
        expected_stream = "compute" if op.op in COMPUTE_OPS else "transfer"
        if op.stream != expected_stream:
            result.fail(
                f"{where}: runs on stream {op.stream!r}, expected {expected_stream!r}", index
            )
            return result
        if op.start < 0 and not _close(op.start, 0.0):
            result.fail(f"ops[{index}].start: {op.start} is before time 0", index)
            return result
        if op.op in COMPUTE_OPS:
            if op.tensor is not None:
                result.fail(f"{where}: only transfers name a tensor", index)
                return result
            st = stages[op.stage]
            duration = st.forward_time if op.op == "F_all" else st.backward_time
            compute.append(index)
        else:
            name = op.tensor if op.tensor is not None else f"s[{op.stage}]"
            expected = {"x[0]", f"s[{op.stage}]"} if op.stage == 0 else {f"s[{op.stage}]"}
            if name not in expected:
                result.fail(
                    f"{where}: tensor {name!r}, expected {' or '.join(sorted(expected))}", index
                )
                return result
            tensor = tensors[name]
            duration = tensor.size / per_ms
            if op.op == "offload":
                if tensor.offload is not None:
                    result.fail(f"{where}: {name} is offloaded twice", index)
                    return result
                tensor.offload = index
            else:
                if tensor.prefetch is not None:
                    result.fail(f"{where}: {name} is prefetched twice", index)
                    return result
                tensor.prefetch = index
            transfers.append(index)
        if not lasts(op.start, op.end, duration):
            result.fail(
                f"ops[{index}].end: {op.end} != start {op.start} + duration {duration} "
                f"of {op.op} stage {op.stage}",
                index,
            )

    # 2. The compute stream: F_all 0..L-1, then B L-1..0, one at a time.
    def position(op: Op) -> int:
        """Place of a compute operation in the model's sequence: F_all 0 .. L-1, B L-1 .. 0."""
        return op.stage if op.op == "F_all" else 2 * length - 1 - op.stage

    # Operations at the same instant (zero-duration ones) run in the model's order.
    starts = _instants(ops[i].start for i in compute)
    compute.sort(key=lambda i: (starts[ops[i].start], position(ops[i])))
    expected_ops = [("F_all", k) for k in range(length)] + [
        ("B", k) for k in reversed(range(length))
    ]
    f_op: dict[int, Op] = {}
    b_op: dict[int, Op] = {}
    previous_end = 0.0
    for place, index in enumerate(compute):
        op = ops[index]
        if place >= len(expected_ops):
            result.fail(f"ops[{index}] {op.op} stage {op.stage}: runs twice", index)
            return result
        want = expected_ops[place]
        if (op.op, op.stage) != want:
            result.fail(
                f"ops[{index}] {op.op} stage {op.stage}: expected {want[0]} stage {want[1]} "
                "(the offloading model runs every forward once, in order, then every backward)",
                index,
            )
            return result
        if not _before(previous_end, op.start):
            result.fail(
                f"ops[{index}] {op.op} stage {op.stage}: starts at {op.start}, before the end "
                f"{previous_end} of the previous compute operation",
                index,
            )
        previous_end = max(previous_end, op.end)
        (f_op if op.op == "F_all" else b_op)[op.stage] = op
    if len(compute) < len(expected_ops):
        missing = expected_ops[len(compute)]
        result.fail(f"incomplete: {missing[0]} stage {missing[1]} never ran")
        return result

    # 3. The transfer stream: one at a time; each tensor's offload and prefetch in a valid window.
    starts = _instants(ops[i].start for i in transfers)
    transfers.sort(key=lambda i: (starts[ops[i].start], ops[i].end))
    previous_end, previous = 0.0, None
    for index in transfers:
        op = ops[index]
        if previous is not None and not _before(previous_end, op.start):
            result.fail(
                f"ops[{index}] {op.op} stage {op.stage}: starts at {op.start} while "
                f"ops[{previous}] still transfers (until {previous_end}); one transfer at a time",
                index,
            )
        if op.end >= previous_end:
            previous_end, previous = op.end, index
    release: dict[str, float] = {}
    for name, tensor in tensors.items():
        if tensor.offload is None:
            if tensor.prefetch is not None:
                pre = ops[tensor.prefetch]
                result.fail(
                    f"ops[{tensor.prefetch}] prefetch stage {pre.stage}: {name} is prefetched "
                    "but never offloaded",
                    tensor.prefetch,
                )
                return result
            continue
        k = -1 if name == "x[0]" else int(name[2:-1])
        off = ops[tensor.offload]
        where = f"ops[{tensor.offload}] offload stage {off.stage}"
        produced = 0.0 if k < 0 else f_op[k].end
        if not _before(produced, off.start):
            result.fail(f"{where}: {name} does not exist yet (it is produced at {produced})")
            return result
        if tensor.prefetch is None:
            result.fail(f"{where}: {name} is offloaded and never prefetched", tensor.offload)
            return result
        reader = k + 1  # the forward that reads it: F_all 0 for x[0], F_all k+1 for s[k]
        release[name] = max(off.end, f_op[reader].end) if reader < length else off.end
        pre = ops[tensor.prefetch]
        where = f"ops[{tensor.prefetch}] prefetch stage {pre.stage}"
        if not _before(release[name], pre.start):
            result.fail(
                f"{where}: starts at {pre.start}, before {name} has left the GPU "
                f"(at {release[name]})",
                tensor.prefetch,
            )
            return result
        first_backward = 0 if k < 0 else min(k + 1, length - 1)
        needed = b_op[first_backward].start
        if not _before(pre.end, needed):
            result.fail(
                f"{where}: {name} arrives at {pre.end}, after B stage {first_backward} "
                f"starts ({needed})",
                tensor.prefetch,
            )
            return result

    # 4. Memory over time. Each allocation and free is an event ordered by (instant, place in the
    # compute sequence, phase): at one instant, a release by a finished offload comes first, then
    # each compute operation reserves (phase 1) and, if it also ends then, frees (phase 2) before
    # the next one, and prefetches reserve last.
    first_place, last_place = -1, 2 * length
    g = [0] + [st.gradient_size for st in stages]
    index_of = {id(op): i for i, op in enumerate(ops)}
    events: list[tuple[float, int, int, int, int]] = []  # (time, place, phase, delta, op index)

    def start_of(op: Op) -> tuple[float, int]:
        return op.start, position(op)

    def end_of(op: Op) -> tuple[float, int]:
        return op.end, position(op)

    def hold(size: int, since: tuple[float, int], until: tuple[float, int], owner: int) -> None:
        if size:
            events.append((since[0], since[1], 1, size, owner))
            events.append((until[0], until[1], 2, -size, owner))

    def hold_tensor(name: str, since: tuple[float, int], until: tuple[float, int], owner: int):
        tensor = tensors[name]
        if tensor.offload is None:
            hold(tensor.size, since, until, owner)
            return
        k = -1 if name == "x[0]" else int(name[2:-1])
        off, pre = ops[tensor.offload], ops[tensor.prefetch]
        reader = f_op.get(k + 1)
        if reader is not None and reader.end >= off.end:
            leaves = end_of(reader)
        else:
            leaves = (off.end, first_place)
        hold(tensor.size, since, leaves, owner)
        hold(tensor.size, (pre.start, last_place), until, tensor.prefetch)

    first = compute[0]
    hold_tensor("x[0]", (0.0, first_place), end_of(b_op[0]), first)
    hold(g[length], (0.0, first_place), end_of(b_op[length - 1]), first)
    for k in range(length):
        fk, bk = f_op[k], b_op[k]
        fi, bi = index_of[id(fk)], index_of[id(bk)]
        hold_tensor(f"s[{k}]", start_of(fk), end_of(bk), fi)
        hold(stages[k].forward_overhead, start_of(fk), end_of(fk), fi)
        hold(stages[k].backward_overhead, start_of(bk), end_of(bk), bi)
        if k > 0:
            hold(g[k], start_of(bk), end_of(b_op[k - 1]), bi)
    instant = _instants(e[0] for e in events)
    events = sorted((instant[e[0]],) + e[1:] for e in events)
    level = static_memory
    result.peak_memory = level
    op_level: dict[int, int] = {}
    curve = result.memory_curve
    for when, _, phase, delta, owner in events:
        level += delta
        if phase == 1:
            op_level[owner] = max(op_level.get(owner, 0), level)
            if level > result.peak_memory:
                result.peak_memory = level
            if memory is not None and level > memory:
                op = ops[owner]
                result.fail(
                    f"ops[{owner}] {op.op} stage {op.stage}: needs {level} bytes at time "
                    f"{when:.6g}, budget {memory}",
                    owner,
                )
        if curve and curve[-1][0] == when:
            curve[-1] = (when, level)
        else:
            curve.append((when, level))
    result.op_peaks = [op_level.get(i, static_memory) for i in range(len(ops))]
    result.makespan = max((op.end for op in ops), default=0.0)
    busy = sum(ops[i].end - ops[i].start for i in compute)
    result.idle_time = max(0.0, result.makespan - busy)
    return result
