"""Run training iterations of a chain of stages exactly as a memplan schedule says.

The runtime is a thin layer over PyTorch's own non-reentrant checkpointing mechanism
(``saved_tensors_hooks``, as ``torch.utils.checkpoint(use_reentrant=False)``): the model's own
forward runs, once, with autograd, building one graph from the input to the loss, and the
runtime decides, stage by stage, what autograd keeps of it (see NOTE [ Planned iteration ]). The
gradients therefore flow through the model's own graph: the loss is the model's or the user's,
tied parameters receive one summed gradient, in-place operations across stage boundaries,
autocast, gradient scaling, gradient accumulation and DDP work as in plain training.

NOTE [ Planned iteration ]
--------------------------
A schedule's forward phase (every op before the first ``B``) computes every stage once, in
order: that is the model's own forward, stage by stage. :meth:`PlannedIteration.begin` and
:meth:`PlannedIteration.end` bracket each stage's computation (the caller runs it: a loop over
the stages in :class:`CheckpointedChain`, the model's own code between module hooks in
:mod:`memplan.torch.enable`):

* ``F_all k`` keeps what autograd saves (``s[k]``): the pack hook leaves the tensors to autograd,
  and records their storages (for the counters and the plan's offloads);
* ``F_ck k`` / ``F_n k`` drop it: the pack hook gives autograd a :class:`_Slot` instead of each
  saved tensor (parameters and buffers excepted), and the runtime holds the output ``x[k+1]``
  only as long as a later recomputation reads it;
* when the backward reaches stage ``k`` (a pre-hook on the node that produced the stage's
  output), the runtime runs the plan's events up to the start of ``B k``: the recomputations
  the plan puts there (``F_ck``/``F_n`` under ``no_grad``; ``F_all`` under ``enable_grad``,
  whose saved tensors fill the slots of stage ``k`` in the order they were packed) and the
  transfers; autograd then runs stage ``k``'s nodes, unpacking the slots, and frees each saved
  tensor when its node has run, as in plain training;
* a callback queued on the autograd engine runs what remains after ``B 0``.

Recomputations are exact: the first forward of each stage the plan runs more than once records
the RNG state and the autocast state; every later forward runs in
:func:`memplan.torch.recompute.recomputing` (the same RNG draws, the buffers updated once) under
the same autocast state, on an input that requires gradients as the original one did (ops save
what they save for that case). A stage that modifies its input in place is run on a copy when the
plan holds that input for a later recomputation.

Transfers (``offload``/``prefetch`` of ``x[k]`` or ``s[k]``, offloading and combined schedules)
run at the plan's points, in the order of the combined simulator (docs/combined.md, rule T5): an
offload copies the tensor's storages to host memory and frees them
(``UntypedStorage.resize_(0)``: every tensor and autograd saved tensor on them stays valid); a
prefetch resizes them back and copies the data in (:class:`memplan.torch.transfers.Mover`).

Every iteration fills :class:`RuntimeCounters` (docs/runtime.md): forward computations per stage,
and the bytes of device memory the activations the plan holds occupy (``x[0]``, standalone
``x[k]``, ``s[k]``) as the plan counts them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.schedule import Schedule, load_schedule
from memplan.torch.blame import FIRST_FORWARD, model_errors
from memplan.torch.chunked_loss import chunk_loss, profile_loss_chunks
from memplan.torch.linearize import Chain, linearize
from memplan.torch.memory_probe import storage_key
from memplan.torch.recompute import RngSnapshot, recomputing, rng_snapshot
from memplan.torch.selective import POLICIES, cached_storages, contexts
from memplan.torch.transfers import (
    GPU,
    HOST,
    LEAVING,
    OFFLOADING,
    PREFETCHING,
    RESIDENT,
    Mover,
    Stored,
    make_stored,
)

__all__ = [
    "CheckpointedChain",
    "PlannedIteration",
    "RuntimeCounters",
    "RuntimePlan",
    "checkpointed",
    "fit",
]

_FORWARD_OPS = ("F_all", "F_ck", "F_n")
_COMPUTE_OPS = (*_FORWARD_OPS, "B")
RUNNABLE_FAMILIES = ("chain", "offload", "combined")
"""Schedule families :func:`checkpointed` runs."""

StageFunction = Callable[[Tensor], Tensor]
"""How a stage is recomputed: its output from its input."""


@dataclass
class RuntimeCounters:
    """What one planned iteration did (reset at every forward of the wrapped module).

    Attributes
    ----------
    forwards : list of dict
        ``forwards[k]`` counts the forward computations of stage ``k`` by kind
        (``{"F_all": 1, "F_ck": 2}``).
    backwards : list of int
        Backward computations per stage (1 each after a full iteration).
    saved_bytes : list of int
        ``saved_bytes[k]``: bytes of ``s[k]`` at its ``F_all`` (the storages autograd saved,
        each counted once, without the stage input, parameters and buffers, plus the output).
    live_bytes : int
        Bytes of device memory the activations held occupy now, as the plan counts them:
        ``x[0]``, standalone ``x[k]`` and ``s[k]`` (an offloaded tensor's storages are resized to
        0 bytes).
    peak_live_bytes : int
        Largest ``live_bytes`` during the iteration.
    live_curve : list of int
        ``live_bytes`` after each event of the plan (the start or end of an operation, in the
        simulator's order): a computation's output counts from its start, what it frees from
        its end, an offloaded tensor until its offload ends, a prefetched one from its start.
    offloaded_bytes : int
        Bytes copied to host memory by the plan's ``offload`` operations.
    prefetched_bytes : int
        Bytes copied back to device memory by its ``prefetch`` operations.
    """

    forwards: list[dict[str, int]] = field(default_factory=list)
    backwards: list[int] = field(default_factory=list)
    saved_bytes: list[int] = field(default_factory=list)
    live_bytes: int = 0
    peak_live_bytes: int = 0
    live_curve: list[int] = field(default_factory=list)
    offloaded_bytes: int = 0
    prefetched_bytes: int = 0

    @classmethod
    def for_stages(cls, n: int) -> RuntimeCounters:
        return cls(forwards=[{} for _ in range(n)], backwards=[0] * n, saved_bytes=[0] * n)

    def forward_count(self, stage: int) -> int:
        """Forward computations of one stage, every kind together."""
        return sum(self.forwards[stage].values())

    def record(self, live: int) -> None:
        self.live_bytes = live
        self.peak_live_bytes = max(self.peak_live_bytes, live)
        self.live_curve.append(live)


def planned_forward_counts(schedule: Schedule, stages: int) -> list[int]:
    """Forward operations per stage in a schedule (what the runtime should count)."""
    counts = [0] * stages
    for op in schedule.ops:
        if op.op in _FORWARD_OPS:
            counts[op.stage] += 1
    return counts


_TENSOR = re.compile(r"^([xs])\[(\d+)\]$")
_TIME_TOLERANCE = 1e-6  # as the simulators: closer instants are one instant


def _timeline(ops: Sequence[Any]) -> list[tuple[bool, Any]]:
    """The plan's operations as ``(is_end, op)`` events in time (docs/combined.md rule T5).

    Computations in the schedule's order; at one instant (within 1e-6) the ends of operations that
    lasted come before the starts (transfer ends before computation ends), and the starts take
    effect in schedule order, a zero-duration operation starting and ending in its place. This is
    the order of the combined simulator, which the runtime follows event by event.
    """
    compute = [op for op in ops if op.op in _COMPUTE_OPS]
    channel = sorted((op for op in ops if op.op not in _COMPUTE_OPS), key=lambda op: op.start)
    times = sorted({t for op in ops for t in (op.start, op.end)})
    instant: dict[float, float] = {}
    last: float | None = None
    for when in times:
        if last is not None and math.isclose(
            when, last, rel_tol=_TIME_TOLERANCE, abs_tol=_TIME_TOLERANCE
        ):
            instant[when] = last
        else:
            instant[when] = last = when
    listed = {id(op): index for index, op in enumerate(ops)}
    keyed = []
    for position, op in enumerate(compute + channel):
        start, end = instant[op.start], instant[op.end]
        index = listed[id(op)]
        keyed.append(((start, 1, index, 0, 0), False, op))
        if end == start:
            keyed.append(((start, 1, index, 1, 1), True, op))
        else:
            keyed.append(((end, 0, int(op.op in _COMPUTE_OPS), position, 1), True, op))
    keyed.sort(key=lambda item: item[0])
    return [(is_end, op) for _, is_end, op in keyed]


def _tensor_name(op: Any) -> str:
    return op.tensor if op.tensor is not None else f"s[{op.stage}]"


def _stored_name(name: str, k: int) -> str:
    """What a forward of stage ``k`` stores: ``s[k]`` for ``F_all``, else ``x[k+1]``."""
    return f"s[{k}]" if name == "F_all" else f"x[{k + 1}]"


@dataclass(frozen=True)
class _Sweep:
    """The forward of one stage in the plan's forward phase: its kind and its two events."""

    op: str
    start: int
    end: int


class RuntimePlan:
    """A schedule prepared for the runtime: its events, its forward sweep, what it reads.

    Parameters
    ----------
    schedule : Schedule
        A feasible schedule (checked by :func:`check_schedule`).
    stages : int
        Stages of the chain, the loss included.

    Raises
    ------
    InputError
        When the plan's forward phase does not compute every stage once, in order, up to the
        loss (every plan memplan's algorithms make does: the runtime needs it, the model's own
        forward being that phase).
    """

    def __init__(self, schedule: Schedule, stages: int) -> None:
        self.schedule = schedule
        self.stages = stages
        self.events = _timeline(schedule.ops)
        self.forward_counts = planned_forward_counts(schedule, stages)
        starts: dict[int, int] = {}
        ends: dict[int, int] = {}
        for i, (is_end, op) in enumerate(self.events):
            (ends if is_end else starts)[id(op)] = i
        compute = [op for op in schedule.ops if op.op in _COMPUTE_OPS]
        first_b = next((i for i, op in enumerate(compute) if op.op == "B"), len(compute))
        phase = compute[:first_b]
        if [op.stage for op in phase] != list(range(stages)) or phase[-1].op != "F_all":
            raise InputError(
                f"the {schedule.algorithm} schedule's forward phase computes stages "
                f"{[op.stage for op in phase]}: the runtime runs plans whose forward phase "
                f"computes every stage once, in order, the loss last with F_all"
            )
        self.sweep = [_Sweep(op.op, starts[id(op)], ends[id(op)]) for op in phase]
        self.backward_start = {op.stage: starts[id(op)] for op in compute[first_b:] if op.op == "B"}
        self.policies = _policies(schedule)
        self.keeps = self._reads()

    def _reads(self) -> set[int]:
        """The events producing a stored tensor the runtime must hold the data of: one a later
        recomputation reads, or one a transfer moves. The others are held by autograd or by the
        model's own code as long as they are needed, as in plain training."""
        held: dict[str, int] = {"x[0]": -1}
        keeps: set[int] = set()
        sweep_starts = {s.start for s in self.sweep}
        for i, (is_end, op) in enumerate(self.events):
            k = op.stage
            if op.op in _FORWARD_OPS and not is_end:
                if i not in sweep_starts:
                    source = f"x[{k}]" if f"x[{k}]" in held else f"s[{k - 1}]"
                    if source in held:
                        keeps.add(held[source])
                held[_stored_name(op.op, k)] = i
            elif op.op not in _COMPUTE_OPS and not is_end:
                name = _tensor_name(op)
                if name in held:
                    keeps.add(held[name])
            elif op.op == "B" and not is_end and k in self.policies:
                # a selective stage recomputes the rest of its forward from x[k] at its backward
                source = f"x[{k}]" if f"x[{k}]" in held else f"s[{k - 1}]"
                if source in held:
                    keeps.add(held[source])
            elif is_end and op.op == "F_n":
                held.pop(f"x[{k}]", None)
            elif is_end and op.op == "B":
                held.pop(f"s[{k}]", None)
                held.pop(f"x[{k}]", None)
        return keeps


def _policies(schedule: Schedule) -> dict[int, str]:
    """The selective policy of each stage whose ``F_all`` runs under an option (option ``i`` is
    :data:`memplan.torch.selective.POLICIES` ``[i - 1]``, the profiler's order)."""
    names = list(POLICIES)
    chosen: dict[int, str] = {}
    for index, op in enumerate(schedule.ops):
        if op.op != "F_all" or not op.option:
            continue
        if op.option > len(names):
            raise InputError(
                f"ops[{index}].option: {op.option}, the runtime knows options 1..{len(names)} "
                f"({', '.join(names)})"
            )
        chosen[op.stage] = names[op.option - 1]
    return chosen


class _Slot:
    """What autograd holds, in place of a saved tensor, for a stage whose forward dropped it:
    the recomputation of the stage (``F_all``) puts the tensor back (NOTE [ Planned
    iteration ])."""

    __slots__ = ("stage", "value")

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.value: Tensor | None = None


def _unpack(packed: Any) -> Any:
    if not isinstance(packed, _Slot):
        return packed
    value = packed.value
    if value is None:
        k = packed.stage
        raise RuntimeError(
            f"B {k}: a tensor stage {k} saved for its backward was not recomputed (the plan "
            "runs no F_all on it before B, or the graph is used twice: memplan's plans are for "
            "one backward per forward)"
        )
    packed.value = None  # autograd holds it while its node runs, as in plain training
    return value


def autocast_state(device: torch.device) -> list[tuple[str, bool, torch.dtype, bool]]:
    """Autocast of the device type and of the CPU now (what a recomputation re-enters)."""
    kinds = [device.type] if device.type == "cpu" else [device.type, "cpu"]
    cache = torch.is_autocast_cache_enabled()
    return [
        (kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind), cache)
        for kind in kinds
    ]


@dataclass
class _StageRun:
    """What the first forward of a stage left for the recomputations of its iteration."""

    function: StageFunction | None = None
    module: nn.Module | None = None
    requires_grad: bool = False
    autocast: list[tuple[str, bool, torch.dtype, bool]] = field(default_factory=list)
    rng: RngSnapshot | None = None
    slots: list[_Slot] = field(default_factory=list)
    node: Any = None
    recompute: Any = None  # a selective stage: the SAC context that replays its forward


class PlannedIteration:
    """One training iteration under a plan (NOTE [ Planned iteration ]).

    The caller runs the forward: for each stage ``k`` in order, ``x = it.begin(k, x, ...)``,
    computes the stage on ``x``, then ``it.end(k, out)``. Stages in ``virtual`` (the caller's
    loss, which the runtime does not see) are not bracketed: autograd computes them as plain
    training does. The backward (``loss.backward()``) follows the plan by itself.

    Parameters
    ----------
    plan : RuntimePlan
        The schedule, prepared.
    x0 : Tensor
        The chain input ``x[0]``.
    static : set of int
        Data pointers of the parameters and buffers (never part of ``s[k]``).
    counters : RuntimeCounters
        Filled during the iteration.
    streams : dict
        CUDA side streams, one per device (kept by the owner across iterations).
    virtual : set of int
        Stages computed outside the runtime (their ops are counted, not run).
    input_transfers : bool
        Whether the plan's transfers of ``x[0]`` run. The input of a model called by the user's
        loop is the caller's tensor, which the caller holds: moving it would free nothing.
    inplace : sequence of bool, optional
        ``inplace[k]``: stage ``k`` modifies its input in place (it then runs on a copy when the
        runtime holds that input for a later recomputation).
    names : sequence of str, optional
        Stage names, for the messages.
    """

    def __init__(
        self,
        plan: RuntimePlan,
        x0: Tensor,
        static: set[int],
        counters: RuntimeCounters,
        streams: dict[Any, Any],
        *,
        virtual: set[int] | None = None,
        input_transfers: bool = True,
        inplace: Sequence[bool] | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        self.plan = plan
        self.counters = counters
        self.static = static
        self.virtual = virtual or set()
        self.input_transfers = input_transfers
        self.inplace = list(inplace) if inplace is not None else [False] * plan.stages
        self.names = list(names) if names is not None else [str(k) for k in range(plan.stages)]
        self.mover = Mover(x0.device, streams)
        self.device = x0.device
        self.held: dict[str, Stored] = {}
        self.held["x[0]"] = make_stored(
            "x[0]", x0, [x0.untyped_storage()], ready=self.mover.produced()
        )
        self.runs = [_StageRun() for _ in range(plan.stages)]
        self.pos = 0
        self.running: tuple[str, int] | None = None
        self.leaving: list[Stored] = []
        self.hooks: Any = None  # the saved_tensors_hooks of the stage being computed
        self.saved: dict[int, torch.UntypedStorage] = {}
        self.inputs: set[int] = set()  # the storages of the stage's input: not part of s[k]
        self.queued = False
        self.done = False
        counters.record(self.live())

    # -- bookkeeping -----------------------------------------------------------------------
    def live(self) -> int:
        """Bytes of the stored tensors, as the plan counts them (shared storages once); an
        ``s[k]`` handed over to its backward counts by the sizes it had (autograd frees its
        storages as the backward goes, and the allocator may reuse their addresses)."""
        total, seen = 0, set()
        for stored in self.held.values():
            if stored.handed:
                total += sum(nbytes for _, nbytes in stored.handed)
                continue
            total += stored.counted
            for storage in stored.storages:
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
                if ptr and nbytes and ptr not in seen:
                    seen.add(ptr)
                    total += nbytes
        return total

    def resident(self, name: str) -> Stored | None:
        stored = self.held.get(name)
        return stored if stored is not None and stored.place in RESIDENT else None

    def source_of(self, k: int) -> Stored:
        """Where the input ``x[k]`` of stage ``k`` is (docs/model.md: held alone or in
        ``s[k-1]``); a RuntimeError when the plan has it nowhere in device memory."""
        found = self.resident(f"x[{k}]")
        if found is None and k > 0:
            found = self.resident(f"s[{k - 1}]")
        if found is None:
            raise RuntimeError(
                f"stage {k}: its input x[{k}] is not in device memory (the plan is invalid)"
            )
        return found

    def input_of(self, k: int) -> Tensor:
        """The data of ``x[k]`` for a recomputation of stage ``k``."""
        stored = self.source_of(k)
        if stored.tensor is None:
            raise RuntimeError(f"stage {k}: the runtime did not keep x[{k}] (the plan is invalid)")
        if stored.tensor._version != stored.version:
            raise RuntimeError(
                f"stage {k} ({self.names[k]}) is recomputed from x[{k}], which was modified in "
                "place since it was stored (an in-place operation at the start of the stage the "
                "model was not seen doing when it was linearized): memplan cannot recompute it; "
                "make the operation out of place, or give memplan a budget that stores the stage"
            )
        return stored.tensor

    def drop(self, name: str) -> None:
        """Free a stored tensor wherever it is (a host copy is dropped)."""
        stored = self.held.get(name)
        if stored is None:
            return
        if stored.place in (OFFLOADING, PREFETCHING):
            raise RuntimeError(f"{name} is freed while it is {stored.place} (the plan is invalid)")
        if stored in self.leaving:
            self.leaving.remove(stored)
        del self.held[name]

    def abort(self) -> None:
        """After an error: put the input back in device memory (it is the caller's tensor),
        leave the stage being computed, forget the plan's tensors."""
        if self.hooks is not None:
            self.hooks.__exit__(None, None, None)
            self.hooks = None
        x0 = self.held.get("x[0]")
        if x0 is not None and x0.place != GPU:
            self.mover.restore(x0)
        self.held.clear()
        self.leaving = []
        self.done = True

    # -- the forward sweep -----------------------------------------------------------------
    def begin(
        self,
        k: int,
        x: Tensor,
        function: StageFunction | None,
        module: nn.Module | None = None,
    ) -> Tensor:
        """The model is about to compute stage ``k`` on ``x`` (its forward in the plan's forward
        phase): run the plan's events up to it and choose what autograd keeps of it.

        Returns the tensor to compute the stage on: ``x``, or a copy when the stage modifies its
        input in place and the runtime holds ``x`` for a later recomputation.

        ``function`` recomputes the stage (its output from its input), ``module`` holds its
        buffers (restored after a recomputation); both are needed only for stages the plan runs
        more than once.
        """
        sweep = self.plan.sweep[k]
        self.run_until(sweep.start)
        self.pos = sweep.start + 1
        run = self.runs[k]
        run.requires_grad = x.requires_grad
        policy = self.plan.policies.get(k)
        if self.plan.forward_counts[k] > 1 or policy is not None:  # what a recomputation
            run.function, run.module = function, module  # needs (and holds: the arguments
            run.autocast = autocast_state(self.device)  # of the stage's call)
            run.rng = rng_snapshot(self.device)
        self._count(sweep.op, k)
        self.running = (sweep.op, k)
        key = storage_key(x)
        self.inputs = set() if key is None else {key[0]}
        if sweep.op == "F_all" and policy is None:
            self.saved = {}
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_kept, _unpack)
        elif sweep.op == "F_all":
            run.slots = []
            hooks = _SelectiveForward(policy, self._pack_dropped(k), run)
        else:
            run.slots = []
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_dropped(k), _unpack)
        if self.inplace[k] and self._holds(x):
            x = x.clone()
        hooks.__enter__()
        self.hooks = hooks
        return x

    def end(self, k: int, out: Tensor) -> None:
        """The model has computed stage ``k``: store what the plan stores, run the plan's events
        up to the end of the computation, and wait for the backward to reach the stage."""
        if self.hooks is not None:
            self.hooks.__exit__(None, None, None)
            self.hooks = None
        sweep = self.plan.sweep[k]
        if not isinstance(out, Tensor):
            raise RuntimeError(f"stage {k} ({self.names[k]}) returned {type(out).__name__}")
        if k in self.plan.policies and sweep.op == "F_all":
            self.saved = self._cached(k)
        self._store(sweep.op, k, out, self.saved, keep=sweep.start in self.plan.keeps)
        self.saved = {}
        self.counters.record(self.live())  # the output counts from the computation's start
        if out.grad_fn is not None:
            self.runs[k].node = out.grad_fn
            out.grad_fn.register_prehook(self._backward_reaches(k))
        self.run_until(sweep.end + 1)

    def _cached(self, k: int) -> dict[int, torch.UntypedStorage]:
        """What a selective forward of stage ``k`` keeps: the storages of its SAC cache."""
        run = self.runs[k]
        if run.recompute is None:
            return {}
        return {
            ptr: storage
            for ptr, storage in cached_storages(run.recompute.forward).items()
            if self._owned(ptr)
        }

    def _owned(self, ptr: int) -> bool:
        """Whether a storage is the stage's own (not a parameter, buffer or the stage input)."""
        return ptr not in self.static and ptr not in self.inputs

    def _holds(self, x: Tensor) -> bool:
        return any(s.tensor is x for s in self.held.values())

    def _count(self, name: str, k: int) -> None:
        forwards = self.counters.forwards[k]
        forwards[name] = forwards.get(name, 0) + 1

    def _pack_kept(self, tensor: Tensor) -> Tensor:
        key = storage_key(tensor)
        if key is not None and self._owned(key[0]):
            self.saved.setdefault(key[0], tensor.untyped_storage())
        return tensor

    def _pack_dropped(self, k: int) -> Callable[[Tensor], Any]:
        slots = self.runs[k].slots

        def pack(tensor: Tensor) -> Any:
            key = storage_key(tensor)
            if key is not None and key[0] in self.static:
                return tensor  # parameters and buffers stay: they are not the plan's to drop
            slot = _Slot(k)
            slots.append(slot)
            return slot

        return pack

    def _store(
        self,
        name: str,
        k: int,
        out: Tensor,
        saved: dict[int, torch.UntypedStorage],
        keep: bool,
    ) -> None:
        """Hold what a forward of stage ``k`` stores: ``s[k]`` (the storages autograd saved,
        the output) or ``x[k+1]``; the output's data only when ``keep`` (a later recomputation
        reads it, a transfer moves it)."""
        target = _stored_name(name, k)
        if target in self.held:
            raise RuntimeError(f"{name} {k}: {target} is already held (the plan is invalid)")
        out_key = storage_key(out)
        storages = list(saved.values())
        counted = 0
        if name == "F_all":
            nbytes = sum(storage.nbytes() for storage in storages)
            if out_key is not None and out_key[0] not in saved:
                nbytes += out_key[1]  # x[k+1] is part of s[k] (the profiler's saved_size)
                if self._owned(out_key[0]):
                    if keep:
                        storages.append(out.untyped_storage())
                    else:
                        counted = out_key[1]
            self.counters.saved_bytes[k] = nbytes
        elif out_key is not None:
            if keep:
                storages = [out.untyped_storage()]
            else:
                counted = out_key[1]
        self.held[target] = make_stored(
            target, out if keep else None, storages, counted, ready=self.mover.produced()
        )

    # -- events ----------------------------------------------------------------------------
    def run_until(self, stop: int) -> None:
        """Run the plan's events ``pos .. stop-1``."""
        events = self.plan.events
        while self.pos < stop:
            is_end, op = events[self.pos]
            self.pos += 1
            self.step(is_end, op)

    def step(self, is_end: bool, op: Any) -> None:
        """Run one event of the plan (the start or the end of an operation)."""
        k = op.stage
        if op.op in _COMPUTE_OPS:
            if is_end:
                self.finish(op.op, k)
            elif op.op == "B":
                self.backward(k)
            elif k in self.virtual and self.pos - 1 == self.plan.sweep[k].start:
                self._count(op.op, k)  # the user's loss: autograd computes it
                self.running = (op.op, k)
                target = _stored_name(op.op, k)
                self.held[target] = make_stored(target, None, [])
            elif self.pos - 1 == self.plan.sweep[k].start:
                raise RuntimeError(
                    f"stage {k} ({self.names[k]}) was not computed when the plan needed it "
                    "(the model's forward did not reach it)"
                )
            else:
                self.recompute(op.op, k)
        elif op.tensor == "x[0]" and not self.input_transfers:
            return
        elif is_end:
            self.transfer_end(op.op, _tensor_name(op))
        else:
            self.transfer_start(op.op, _tensor_name(op))
        self.counters.record(self.live())

    @contextmanager
    def _replay(self, k: int) -> Iterator[None]:
        """A recomputation of stage ``k``: the RNG state and the autocast state of its first
        forward, its buffers restored afterwards (:func:`recomputing`)."""
        run = self.runs[k]
        with ExitStack() as stack:
            for kind, enabled, dtype, cache in run.autocast:
                stack.enter_context(
                    torch.autocast(kind, dtype=dtype, enabled=enabled, cache_enabled=cache)
                )
            module = run.module if run.module is not None else nn.Module()
            stack.enter_context(recomputing(module, run.rng, self.device))
            yield

    def recompute(self, name: str, k: int) -> None:
        """A forward of stage ``k`` after its first one (the plan recomputes it)."""
        run = self.runs[k]
        if run.function is None:
            raise RuntimeError(f"stage {k} ({self.names[k]}) cannot be recomputed")
        src = self.input_of(k)
        self._count(name, k)
        self.running = (name, k)
        keep = (self.pos - 1) in self.plan.keeps
        if name != "F_all":
            inp = src.detach()
            if self.inplace[k]:
                inp = inp.clone()
            with self._replay(k), torch.no_grad():
                out = run.function(inp)
            self._store(name, k, out.detach(), {}, keep)
            return
        inp = src.detach()
        if run.requires_grad:
            inp.requires_grad_(True)
        if self.inplace[k]:  # not a leaf: in-place operations on it are allowed (the backward
            with torch.enable_grad():  # runs without gradients: the copy is made with them)
                inp = inp.clone()
        keys = (storage_key(t) for t in (src, inp))
        self.inputs = {key[0] for key in keys if key is not None}
        policy = self.plan.policies.get(k)
        if policy is not None:  # a selective F_all: keeps the policy's cache, fills no slot
            forward = _SelectiveForward(policy, lambda tensor: None, run)
            with self._replay(k), torch.enable_grad(), forward:
                out = run.function(inp)
            self._store("F_all", k, out.detach(), self._cached(k), keep)
            return
        packed: list[Tensor] = []
        saved: dict[int, torch.UntypedStorage] = {}

        def pack(tensor: Tensor) -> None:
            # Detached: a recomputed tensor must not refer to the recomputation's graph, whose
            # saved-tensor hooks refer to this list (a cycle through autograd that would keep
            # every recomputed tensor until the last one is freed).
            packed.append(tensor.detach())
            key = storage_key(tensor)
            if key is not None and self._owned(key[0]):
                saved.setdefault(key[0], tensor.untyped_storage())

        out = self._fill_slots(k, inp, pack, packed)
        self._store("F_all", k, out, saved, keep)

    def _fill_slots(
        self, k: int, inp: Tensor, pack: Callable[[Tensor], None], packed: list[Tensor]
    ) -> Tensor:
        """Run stage ``k`` on ``inp`` with gradients (under its SAC recomputation context when
        it is selective) and put what autograd saves into the slots of its first forward;
        returns the output, detached."""
        run = self.runs[k]
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, _unpack)
        replay = run.recompute.recompute if run.recompute is not None else nullcontext()
        with self._replay(k), torch.enable_grad(), hooks, replay:
            out = run.function(inp)
        slots = [s for s in run.slots]
        dropped = len(slots)
        kept = [t for t in packed if storage_key(t) is None or storage_key(t)[0] not in self.static]
        if len(kept) != dropped:
            raise RuntimeError(
                f"stage {k} ({self.names[k]}): its recomputation saved {len(kept)} tensors for "
                f"the backward, its forward {dropped}: the stage does not compute the same way "
                "twice (a data-dependent branch?); memplan cannot recompute it"
            )
        for slot, tensor in zip(slots, kept, strict=True):
            slot.value = tensor
        run.slots = []
        run.recompute = None
        return out.detach()

    def backward(self, k: int) -> None:
        """Start of ``B k``: autograd is about to run stage ``k``'s nodes."""
        saved = self.held.get(f"s[{k}]")
        if saved is None or saved.place not in (GPU, OFFLOADING):
            where = "not held" if saved is None else saved.place
            raise RuntimeError(
                f"B {k}: s[{k}] is not in device memory ({where}; the plan is invalid)"
            )
        self.source_of(k)  # the plan holds the input (docs/model.md)
        self.counters.backwards[k] += 1
        self.running = ("B", k)
        if self.runs[k].recompute is not None:
            self._recompute_selective(k)
        saved.hand_over()  # autograd frees what it saved as the backward goes

    def _recompute_selective(self, k: int) -> None:
        """The start of ``B k`` after a selective ``F_all k``: its forward again, the policy's
        outputs taken from the cache, what autograd saves put into the slots."""
        inp = self.input_of(k).detach()
        run = self.runs[k]
        if run.requires_grad:
            inp.requires_grad_(True)
        if self.inplace[k]:
            with torch.enable_grad():
                inp = inp.clone()
        packed: list[Tensor] = []

        def pack(tensor: Tensor) -> None:
            packed.append(tensor.detach())

        self._fill_slots(k, inp, pack, packed)

    def finish(self, name: str, k: int) -> None:
        """End of a computation: free what it frees, and the tensors whose offload ended."""
        self.running = None
        for stored in self.leaving:
            self.mover.release(stored)
            stored.place = HOST
        self.leaving = []
        if name == "F_n":
            self.drop(f"x[{k}]")
        elif name == "B":
            self.drop(f"s[{k}]")
            self.drop(f"x[{k}]")

    def _reads(self, name: str) -> bool:
        """Whether the running computation reads the stored tensor ``name``."""
        if self.running is None:
            return False
        op, k = self.running
        reads = {f"x[{k}]", f"s[{k - 1}]"} | ({f"s[{k}]"} if op == "B" else set())
        return name in reads

    def transfer_start(self, op: str, name: str) -> None:
        stored = self.held.get(name)
        where = "not held" if stored is None else stored.place
        if op == "offload":
            if stored is None or stored.place != GPU:
                raise RuntimeError(f"offload {name}: it is {where}, not on the device")
            if not all(storage.resizable() for storage in stored.storages):
                raise RuntimeError(
                    f"offload {name}: its memory cannot be freed (a storage that is not "
                    "resizable, e.g. an input made by torch.from_numpy: pass a copy)"
                )
            for other in self.held.values():
                if other is not stored and other.place in RESIDENT:
                    shared = {s.data_ptr() for s in other.storages} & {
                        s.data_ptr() for s in stored.storages
                    }
                    if shared:
                        raise RuntimeError(
                            f"offload {name}: it shares memory with {other.name} (a stage "
                            "returning a view of its input cannot be offloaded alone)"
                        )
            self.counters.offloaded_bytes += self.mover.offload(stored)
            stored.place = OFFLOADING
        else:
            if stored is None or stored.place != HOST:
                raise RuntimeError(f"prefetch {name}: it is {where}, not in host memory")
            self.counters.prefetched_bytes += self.mover.prefetch(stored)
            stored.place = PREFETCHING

    def transfer_end(self, op: str, name: str) -> None:
        stored = self.held[name]
        if op == "offload":
            if self._reads(name):  # the running computation reads it: freed at its end
                stored.place = LEAVING
                self.leaving.append(stored)
            else:
                self.mover.release(stored)
                stored.place = HOST
        else:
            self.mover.arrived(stored)
            stored.place = GPU

    # -- the backward ----------------------------------------------------------------------
    def _backward_reaches(self, k: int) -> Callable[[Any], None]:
        def prehook(grad_outputs: Any) -> None:
            if self.done:
                return
            try:
                if not self.queued:
                    self.queued = True
                    torch.autograd.Variable._execution_engine.queue_callback(self._complete)
                self.run_until(self.plan.backward_start[k] + 1)
            except BaseException:
                self.abort()
                raise

        return prehook

    def _complete(self) -> None:
        """After the backward: the rest of the plan (the end of ``B 0``...)."""
        if self.done:
            return
        try:
            self.run_until(len(self.plan.events))
            self.mover.finish()
        except BaseException:
            self.abort()
            raise
        self.held.clear()
        self.runs = []
        self.done = True


class _SelectiveForward:
    """A forward of a stage under a selective policy: autograd's saved tensors go to ``pack``
    (the slots), the policy's outputs to the SAC cache, whose recomputation context the stage's
    run keeps (:mod:`memplan.torch.selective`)."""

    def __init__(self, policy: str, pack: Callable[[Tensor], Any], run: _StageRun) -> None:
        self.caching, recompute = contexts(policy)
        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, _unpack)
        run.recompute = _Recompute(self.caching, recompute)

    def __enter__(self) -> None:
        self.hooks.__enter__()
        self.caching.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.caching.__exit__(*exc)
        self.hooks.__exit__(*exc)


@dataclass
class _Recompute:
    """The two SAC contexts of a selective stage's iteration: the cache is the first's."""

    forward: Any
    recompute: Any


class CheckpointedChain(nn.Module):
    """A chain of stages (the last one the loss) that trains as a schedule says.

    ``module(x)`` runs the stages and returns the scalar loss of the chain's loss stage;
    ``module(x, target)`` gives ``target`` to the loss stage: the batch's own labels (a language
    model's loss built without labels predicts the tokens of the batch it is called on; the
    other losses of :func:`~memplan.torch.linearize.make_loss` otherwise use the targets fixed
    when the chain was made, which is what ``memplan run`` measures with). ``loss.backward()``
    follows the plan. Without gradients (evaluation), the stages run plainly.
    :func:`memplan.torch.enable` is the way to train a model in one's own loop.

    Attributes
    ----------
    schedule : Schedule
        The plan followed.
    names : list of str
        Stage names.
    counters : RuntimeCounters
        What the last iteration did.
    """

    def __init__(
        self,
        stages: Sequence[tuple[str, nn.Module]],
        schedule: Schedule,
        inplace: Sequence[bool] | None = None,
    ) -> None:
        super().__init__()
        self.names = [name for name, _ in stages]
        self.modules_ = nn.ModuleList([module for _, module in stages])
        self.schedule = schedule
        self.plan = RuntimePlan(schedule, len(self.modules_))
        self.inplace = list(inplace) if inplace is not None else [False] * len(self.names)
        self._side_streams: dict[Any, Any] = {}  # CUDA: the transfer stream of each device
        self.counters = RuntimeCounters()

    def planned_forward_counts(self) -> list[int]:
        """Forward operations per stage in the schedule."""
        return planned_forward_counts(self.schedule, len(self.modules_))

    def _static_pointers(self) -> set[int]:
        keys = (storage_key(t) for t in [*self.parameters(), *self.buffers()])
        return {key[0] for key in keys if key is not None}

    def forward(self, x: Tensor, target: Any = None) -> Tensor:
        """Run the stages under the plan; returns the loss (a scalar tensor)."""
        last = len(self.modules_) - 1
        loss = self.modules_[last]
        if target is None and getattr(loss, "labels_from_input", False):
            with torch.no_grad():  # next-token prediction of this batch, not of the example
                loss.follow_input(x)  # (before the plan may move x[0] to the host)
        if not torch.is_grad_enabled():
            for k, module in enumerate(self.modules_):
                x = module(x) if k < last or target is None else module(x, target)
            return x
        self.counters = RuntimeCounters.for_stages(last + 1)
        it = PlannedIteration(
            self.plan, x, self._static_pointers(), self.counters, self._side_streams,
            inplace=self.inplace, names=self.names,
        )  # fmt: skip
        try:
            for k, module in enumerate(self.modules_):
                function: StageFunction = module
                if k == last and target is not None:
                    function = _with_target(module, target)
                x = function(it.begin(k, x, function, module))
                it.end(k, x)
        except BaseException:
            it.abort()
            raise
        return x


def _with_target(module: nn.Module, target: Any) -> StageFunction:
    def loss(x: Tensor) -> Tensor:
        return module(x, target)

    return loss


# ------------------------------------------------------------------------------------------------


def _stages_of(model: Chain | nn.Module | Sequence[Any]) -> list[tuple[str, nn.Module]]:
    if isinstance(model, Chain):
        return list(model.stages)
    if isinstance(model, nn.Sequential):
        return [
            (f"stage{name}" if name.isdigit() else name, module)
            for name, module in model.named_children()
        ]
    out: list[tuple[str, nn.Module]] = []
    for i, item in enumerate(model):
        if isinstance(item, nn.Module):
            out.append((f"stage{i}", item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], nn.Module):
            out.append((str(item[0]), item[1]))
        else:
            raise InputError(f"stages[{i}]: expected an nn.Module or a (name, nn.Module) pair")
    return out


def check_schedule(schedule: Schedule, names: Sequence[str], profile: Any | None = None) -> None:
    """Check that a schedule was made for this chain (and this profile, when given).

    Raises
    ------
    InputError
        Infeasible schedule, a family the runtime cannot run, a different number of stages,
        transfers naming no stored tensor, or a profile whose sha256, model name or stage names
        differ from the schedule's, or on which the schedule does not replay (simulator).
    """
    if not schedule.feasible:
        raise InputError(
            f"the {schedule.algorithm} schedule is infeasible (feasible: false): nothing to run"
        )
    if schedule.family not in RUNNABLE_FAMILIES:
        raise InputError(
            f"schedule family {schedule.family!r}: the runtime runs "
            f"{', '.join(RUNNABLE_FAMILIES)} schedules"
        )
    stages = schedule.profile.stages
    if stages is not None and stages != len(names):
        raise InputError(
            f"the schedule was made for {stages} stages ({schedule.profile.model}), "
            f"the model has {len(names)}"
        )
    for index, op in enumerate(schedule.ops):
        if op.stage >= len(names):
            raise InputError(f"ops[{index}]: stage {op.stage} out of range for {len(names)} stages")
        if op.op in _COMPUTE_OPS:
            if op.stream != "compute" or op.tensor is not None:
                raise InputError(f"ops[{index}]: {op.op} runs on stream compute, names no tensor")
            continue
        if schedule.family == "chain" or op.stream != "transfer":
            raise InputError(
                f"ops[{index}]: {op.op} in a {schedule.family} schedule, stream {op.stream}"
            )
        name = _tensor_name(op)
        match = _TENSOR.match(name)
        limit = len(names) if match and match.group(1) == "x" else len(names) - 1
        if match is None or int(match.group(2)) > limit:
            raise InputError(
                f"ops[{index}].tensor: {name!r}, expected x[0..{len(names)}] or "
                f"s[0..{len(names) - 1}]"
            )
    if profile is None:
        return
    from memplan.profile.io import load_profile

    prof = load_profile(profile)
    if prof.sha256() != schedule.profile.sha256:
        raise InputError(
            f"the schedule was made for profile sha256 {schedule.profile.sha256[:12]}... "
            f"({schedule.profile.model}), this profile has {prof.sha256()[:12]}... ({prof.model})"
        )
    if prof.model != schedule.profile.model:
        raise InputError(
            f"the schedule names model {schedule.profile.model!r}, the profile {prof.model!r}"
        )
    if prof.length != len(names):
        raise InputError(f"the profile has {prof.length} stages, the model {len(names)}")
    profiled = [s.name for s in prof.stages]
    if profiled != list(names) and not all(n.startswith("stage") for n in names):
        raise InputError(f"stage names differ: the profile has {profiled}, the model {list(names)}")
    # The plan must replay on its profile (a hand-edited file may not): its family's simulator.
    import memplan

    result = memplan.simulate(prof, schedule, memory=None, check_claims=False)
    if not result.valid:
        raise InputError(f"the schedule does not replay on its profile: {result.violation}")


def checkpointed(
    model: Chain | nn.Module | Sequence[Any],
    schedule: Schedule | dict[str, Any] | str,
    *,
    example_input: Tensor | None = None,
    profile: Any | None = None,
) -> CheckpointedChain:
    """Wrap a chain of stages so that one forward + backward follows ``schedule`` exactly.

    Parameters
    ----------
    model : Chain, nn.Module or sequence
        A :class:`memplan.torch.Chain` (from :func:`~memplan.torch.linearize`), a model to
        linearize (needs ``example_input``), an ``nn.Sequential`` whose children are the stages, or
        a list of modules / ``(name, module)`` pairs. The last stage is the loss: it returns a
        scalar.
    schedule : Schedule, dict or path
        A feasible ``chain`` or ``offload`` schedule for this chain.
    example_input : Tensor, optional
        Input used to linearize ``model`` when it is a plain module.
    profile : Profile, dict, path or name, optional
        The profile the schedule was made from: its sha256, model name, stage count and names are
        checked against the schedule and the chain.

    Returns
    -------
    CheckpointedChain
        ``wrapped(x)`` returns the loss; ``loss.backward()`` follows the plan.

    Raises
    ------
    InputError
        When the schedule does not match the chain or the profile.
    """
    sched = load_schedule(schedule)
    plain_sequential = isinstance(model, nn.Sequential) and example_input is None
    if isinstance(model, nn.Module) and not plain_sequential:
        if example_input is None:
            raise InputError(
                "checkpointed: give example_input to linearize the model, or pass a "
                "memplan.torch.Chain (linearize(model, x)) or a list of stages ending with the loss"
            )
        model = linearize(model, example_input)
    stages = _stages_of(model)
    check_schedule(sched, [name for name, _ in stages], profile)
    inplace = model.inplace if isinstance(model, Chain) and model.inplace else None
    return CheckpointedChain(stages, sched, inplace=inplace)


def solve_feasible(
    profile: Any,
    algo: str,
    memory: int | str,
    slots: int | None = None,
    optimizer: str = "sgd",
    bandwidth: float | str | None = None,
    gradients: str = "at-backward",
) -> Schedule:
    """:func:`memplan.solve`, with no plan as an :class:`InputError` that says the least memory
    that fits (what :func:`fit` and :func:`memplan.torch.enable` need: a plan to run). The
    training loop is PyTorch's default (``gradients``, docs/model.md) unless said otherwise."""
    import memplan

    sched = memplan.solve(
        profile,
        algo=algo,
        memory=memory,
        slots=slots,
        optimizer=optimizer,
        bandwidth=bandwidth,
        gradients=gradients,
    )
    if not sched.feasible:
        least = "" if sched.min_memory is None else "; the least memory that fits is "
        least += "" if sched.min_memory is None else f"{sched.min_memory} bytes"
        raise InputError(f"no {algo} plan fits in {memory}{least}")
    return sched


def fit(
    model: str | nn.Module,
    example_input: Tensor | Mapping[str, Any] | None = None,
    memory: int | str = "8GB",
    algo: str = "rotor",
    *,
    profile: Any | None = None,
    slots: int | None = None,
    optimizer: str = "sgd",
    bandwidth: float | str | None = None,
    repeats: int = 3,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    labels: Tensor | None = None,
    config: str | Mapping[str, Any] | None = None,
    gradients: str = "at-backward",
    loss_chunks: int | None = None,
) -> tuple[CheckpointedChain, Schedule]:
    """Profile a model, solve for a budget and wrap it: ``profile -> solve -> checkpointed``.

    Parameters
    ----------
    model : str or nn.Module
        A model name of :data:`memplan.torch.models.MODELS`, ``hf:NAME``, ``timm:NAME``, or a
        module (a Hugging Face ``transformers`` model included).
    example_input : Tensor or mapping, optional
        The chain input (built from ``batch_size``/``input_shape`` for a name when omitted), or a
        Hugging Face batch: ``{"input_ids" or "pixel_values": ..., "labels": ...,
        "attention_mask": all ones}`` (:func:`memplan.torch.hf.hf_batch`).
    memory, algo, slots, optimizer, bandwidth
        As in :func:`memplan.solve` (slots: 500 by default, pofo 50; bandwidth: the
        profile's by default, needed by the offloading algorithms and pofo).
    profile : optional
        A profile of this model to use instead of profiling it.
    repeats : int
        Timed repetitions per stage when profiling.
    batch_size, input_shape
        For a model given by name without ``example_input``.
    labels : Tensor, optional
        Targets of the loss stage as the model's own loss takes them (HF ``labels``); a batch's
        ``labels`` otherwise. The wrapped chain's loss is then the model's training loss.
    config : str or mapping, optional
        Config values of an ``hf:`` model given by name.
    loss_chunks : int, optional
        A language model's head and loss in this many chunks of tokens, one stage
        (:mod:`memplan.torch.chunked_loss`; the wrapped chain returns the loss, never the
        logits); a given ``profile`` says its own.

    Returns
    -------
    (CheckpointedChain, Schedule)
        The wrapped chain and the plan it follows: ``wrapped(x).backward()`` trains one
        iteration with the gradients of plain training.

    Raises
    ------
    InputError
        Bad input, or no plan of ``algo`` fits ``memory`` (the message says the least memory).
    """
    import memplan
    from memplan.torch.conditions import check_conditions
    from memplan.torch.models import build_model
    from memplan.torch.profiler import profile_model

    x: Tensor | None
    if isinstance(example_input, Mapping):
        from memplan.torch.hf import hf_batch

        x, batch_labels = hf_batch(example_input)
        labels = batch_labels if labels is None else labels
    else:
        x = example_input
    if isinstance(model, str):
        module, built, label = build_model(
            model, batch_size=batch_size, input_shape=input_shape, config=config
        )
        x = built if x is None else x
    else:
        if x is None:
            raise InputError("fit: example_input is required with a module")
        if config:
            raise InputError("fit: config applies to a model given by name (hf:NAME)")
        module, label = model, None
    if profile is None:  # measured on the threads the caller's loop will train on
        prof = profile_model(
            module, example_input=x, device=str(x.device), repeats=repeats, name=label,
            threads=torch.get_num_threads(), loss_chunks=loss_chunks,
        )  # fmt: skip
    else:
        prof = memplan.load_profile(profile)
        check_conditions(prof, x.device)  # a warning where it was measured otherwise
    chunks = profile_loss_chunks(prof, loss_chunks)
    sched = solve_feasible(prof, algo, memory, slots, optimizer, bandwidth, gradients)
    kind = label or type(module).__name__
    with model_errors(kind, FIRST_FORWARD):  # NOTE [ whose error ]
        chain = chunk_loss(linearize(module, x, labels=labels), x, chunks, kind)
    return checkpointed(chain, sched, profile=prof), sched


def _activation_replay(profile: Any, schedule: Schedule) -> Any:
    """The combined simulator's replay of ``schedule`` on the activations alone."""
    import memplan
    from memplan.simulator.combined import simulate_combined

    prof = memplan.load_profile(profile)
    data = prof.model_dump(exclude_none=True)
    for stage in data["stages"]:
        stage.update(forward_overhead=0, backward_overhead=0, grad_size=0)
    bare = memplan.load_profile(data)
    result = simulate_combined(
        bare, schedule.ops, static_memory=0, memory=None, bandwidth=schedule.budget.bandwidth or 1.0
    )
    if not result.valid:
        raise InputError(f"the schedule does not replay on this profile: {result.violation}")
    return result


def planned_activation_curve(profile: Any, schedule: Schedule) -> list[int]:
    """The plan's held activation bytes after each event: what ``RuntimeCounters.live_curve``
    measures on CPU, point for point.

    The combined simulator (docs/combined.md; chain and offloading plans are special cases of its
    model) replays the schedule on a copy of the profile without temporary memory
    (``forward_overhead = backward_overhead = 0``), without gradients (``grad_size = 0``) and
    without static memory. Its memory curve is then the total of ``x[0]``, the standalone
    ``x[k]`` and the ``s[k]`` in device memory, at the start of the iteration and after each
    event (the start or end of an operation), in the order the runtime follows them.
    """
    return [int(nbytes) for _, nbytes in _activation_replay(profile, schedule).memory_curve]


def planned_activation_peak(profile: Any, schedule: Schedule) -> int:
    """The plan's peak of held activations: the largest of :func:`planned_activation_curve`,
    what ``RuntimeCounters.peak_live_bytes`` measures on CPU (docs/runtime.md)."""
    return int(_activation_replay(profile, schedule).peak_memory)
