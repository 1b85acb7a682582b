"""Run one training iteration of a linearized model exactly as a memplan schedule says.

:func:`checkpointed` wraps the stages of a chain (:func:`memplan.torch.linearize.linearize`) in a
module whose forward returns the loss and whose backward replays the schedule's ``ops``, the way
``torch.utils.checkpoint`` (reentrant) does for one segment:

* the forward phase (every op before the first ``B``) runs in a ``torch.autograd.Function``
  without autograd, except the ``F_all`` stages, which run under ``torch.enable_grad`` on a
  detached input and keep their graph (``s[k]``: what autograd saved, and the output ``x[k+1]``);
  ``F_ck``/``F_n`` keep only their output ``x[k+1]`` (``F_n`` drops its input ``x[k]``);
* its backward replays the rest of the ops: ``B k`` calls ``torch.autograd.backward`` on the
  output of stage ``k`` with ``g[k+1]``, which accumulates the parameter gradients and gives
  ``g[k]`` as the gradient of the detached input; then ``s[k]`` and the standalone ``x[k]`` are
  dropped (docs/model.md). Recomputations (``F_ck``/``F_n``/``F_all`` of a stage already run)
  restore the RNG state of the stage's first forward (dropout masks are the same) and its
  buffers afterwards (batch-norm running statistics are updated once per iteration, as in plain
  training).

Transfers (``offload``/``prefetch`` of ``x[k]`` or ``s[k]``, offloading and combined schedules)
run at the plan's points: the runtime follows the plan event by event, in the order of the combined
simulator (docs/combined.md, rule T5). An offload copies the tensor's storages to host memory and
frees them (``UntypedStorage.resize_(0)``: every tensor and autograd saved tensor on them stays
valid, empty); a prefetch resizes them back and copies the data in. The same code runs on CPU
(plain synchronous copies) and CUDA (pinned buffers, a side stream, events: the copy engine
:class:`memplan.torch.transfers.Mover`).

Every iteration fills :class:`RuntimeCounters` (docs/runtime.md): forward computations per stage,
and the bytes of device memory the activations the plan holds occupy (``x[0]``, standalone ``x[k]``,
``s[k]`` found through ``saved_tensors_hooks``) over the iteration.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.schedule import Schedule, load_schedule
from memplan.torch.linearize import Chain, linearize
from memplan.torch.memory_probe import storage_key
from memplan.torch.recompute import RngSnapshot, recomputing, rng_snapshot
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

__all__ = ["CheckpointedChain", "RuntimeCounters", "checkpointed", "fit"]

_FORWARD_OPS = ("F_all", "F_ck", "F_n")
_COMPUTE_OPS = (*_FORWARD_OPS, "B")
RUNNABLE_FAMILIES = ("chain", "offload", "combined")
"""Schedule families :func:`checkpointed` runs."""


def _identity(value: Any) -> Any:
    return value


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
        ``saved_bytes[k]``: bytes of ``s[k]`` at its last ``F_all`` (the storages autograd saved,
        each counted once, without the stage input, parameters and buffers, plus the output).
    live_bytes : int
        Bytes of device memory the activations held occupy now: ``x[0]``, standalone ``x[k]``
        and ``s[k]`` (the storages themselves: an offloaded tensor's are resized to 0 bytes).
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


class _Iteration:
    """The tensors one planned iteration holds (docs/model.md, docs/combined.md), and counters."""

    def __init__(self, owner: CheckpointedChain, x0: Tensor) -> None:
        self.owner = owner
        self.counters = owner.counters
        self.static = owner._static_pointers()
        self.mover = Mover(x0.device, owner._side_streams)
        self.held: dict[str, Stored] = {}
        self.held["x[0]"] = make_stored(
            "x[0]", x0, [x0.untyped_storage()], ready=self.mover.produced()
        )
        self.grad: Tensor | None = None
        self.rng: dict[int, RngSnapshot] = {}
        self.running: tuple[str, int] | None = None
        self.leaving: list[Stored] = []

    # -- bookkeeping -----------------------------------------------------------------------
    def live(self) -> int:
        """Bytes of device memory the stored tensors occupy now (shared storages once); an
        ``s[k]`` handed over to its backward counts by the sizes it had, as the plan counts it
        (autograd may have freed its storages, and the allocator reused their addresses)."""
        total, seen = 0, set()
        for stored in self.held.values():
            if stored.handed:
                total += sum(nbytes for _, nbytes in stored.handed)
                continue
            for storage in stored.storages:
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
                if ptr and nbytes and ptr not in seen:
                    seen.add(ptr)
                    total += nbytes
        return total

    def resident(self, name: str) -> Stored | None:
        stored = self.held.get(name)
        return stored if stored is not None and stored.place in RESIDENT else None

    def input_of(self, k: int) -> Tensor:
        x = self.resident(f"x[{k}]")
        if x is not None:
            return x.tensor
        s = self.resident(f"s[{k - 1}]") if k > 0 else None
        if s is not None:
            return s.tensor.detach()
        raise RuntimeError(
            f"stage {k}: its input x[{k}] is not in device memory (the plan is invalid)"
        )

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
        """After an error: put the input back in device memory (it is the caller's tensor)."""
        x0 = self.held.get("x[0]")
        if x0 is not None and x0.place != GPU:
            self.mover.restore(x0)
        self.held.clear()
        self.leaving = []

    @contextmanager
    def _replay_state(self, k: int, device: torch.device) -> Iterator[None]:
        """First forward of a stage the plan runs more than once: remember the RNG state. Later
        ones: :func:`recomputing` (the same RNG draws, the buffers updated once)."""
        if self.owner._forward_counts[k] <= 1:
            yield
            return
        if k not in self.rng:
            self.rng[k] = rng_snapshot(device)
            yield
            return
        with recomputing(self.owner.modules_[k], self.rng[k], device):
            yield

    # -- events ----------------------------------------------------------------------------
    def step(self, is_end: bool, op: Any) -> None:
        """Run one event of the plan (the start or the end of an operation)."""
        if op.op in _COMPUTE_OPS:
            if is_end:
                self.finish(op.op, op.stage)
            elif op.op == "B":
                self.backward(op.stage)
            else:
                self.forward(op.op, op.stage)
        elif is_end:
            self.transfer_end(op.op, _tensor_name(op))
        else:
            self.transfer_start(op.op, _tensor_name(op))
        self.counters.record(self.live())

    def forward(self, name: str, k: int) -> None:
        """Start of ``F_all``/``F_ck``/``F_n`` on stage ``k``: compute the output now."""
        module = self.owner.modules_[k]
        src = self.input_of(k)
        target = f"s[{k}]" if name == "F_all" else f"x[{k + 1}]"
        if target in self.held:
            raise RuntimeError(f"{name} {k}: {target} is already held (the plan is invalid)")
        self.counters.forwards[k][name] = self.counters.forwards[k].get(name, 0) + 1
        self.running = (name, k)
        if name != "F_all":
            with self._replay_state(k, src.device), torch.no_grad():
                out = module(src)
            self.held[target] = make_stored(
                target, out, [out.untyped_storage()], ready=self.mover.produced()
            )
            return
        inp = src.detach()
        if k > 0 and inp.is_floating_point():
            inp.requires_grad_(True)
        saved: dict[int, torch.UntypedStorage] = {}
        excluded = set(self.static)
        key = storage_key(inp)
        if key is not None:
            excluded.add(key[0])

        def pack(tensor: Tensor) -> Tensor:
            key = storage_key(tensor)
            if key is not None and key[0] not in excluded:
                saved.setdefault(key[0], tensor.untyped_storage())
            return tensor

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, _identity)
        with self._replay_state(k, src.device), torch.enable_grad(), hooks:
            out = module(inp)
        out_key = storage_key(out)
        nbytes = sum(storage.nbytes() for storage in saved.values())
        if out_key is not None and out_key[0] not in saved:
            nbytes += out_key[1]  # the output x[k+1] is part of s[k] (the profiler's saved_size)
            if out_key[0] not in excluded:
                saved[out_key[0]] = out.untyped_storage()
        self.counters.saved_bytes[k] = nbytes
        self.held[target] = make_stored(
            target, out, list(saved.values()), inp=inp, ready=self.mover.produced()
        )
        # Autograd keeps the pack hook (and what it refers to) as long as any tensor it packed
        # is saved: emptied, it holds no storage until the end of B k (docs/runtime.md).
        saved.clear()

    def backward(self, k: int) -> None:
        """Start of ``B k``: backpropagate through ``s[k]`` with ``g[k+1]``, giving ``g[k]``."""
        saved = self.held.get(f"s[{k}]")
        if saved is None or saved.place not in (GPU, OFFLOADING):
            where = "not held" if saved is None else saved.place
            raise RuntimeError(
                f"B {k}: s[{k}] is not in device memory ({where}; the plan is invalid)"
            )
        self.input_of(k)  # the plan holds the input (docs/model.md)
        inp = saved.inp
        if inp is not None and inp.numel() and inp.untyped_storage().nbytes() == 0:
            raise RuntimeError(
                f"B {k}: the input s[{k}] was computed from is not in device memory "
                f"(the plan holds another copy of x[{k}]; the runtime needs the one it read)"
            )
        self.counters.backwards[k] += 1
        self.running = ("B", k)
        saved.hand_over()  # autograd frees what it saved as the backward goes
        if saved.tensor.requires_grad:
            torch.autograd.backward(saved.tensor, self.grad)
        self.grad = inp.grad if inp is not None and inp.requires_grad else None

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


class _PlannedChain(torch.autograd.Function):
    """Forward phase in ``forward``, the rest of the plan in ``backward`` (reentrant)."""

    @staticmethod
    def forward(ctx: Any, owner: CheckpointedChain, x0: Tensor, anchor: Tensor) -> Tensor:
        it = _Iteration(owner, x0)
        events, split = owner._events, owner._split
        last = len(owner.modules_) - 1
        try:
            for is_end, op in events[:split]:
                it.step(is_end, op)
            loss = it.resident(f"s[{last}]")
            if loss is None:
                raise InputError(
                    f"the plan does not run F_all on the loss stage ({last}) before its first B"
                )
        except BaseException:
            it.abort()
            raise
        ctx.iteration = it
        ctx.split = split
        return loss.tensor.detach().clone()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[None, None, None]:
        it: _Iteration = ctx.iteration
        it.grad = grad_loss
        try:
            for is_end, op in it.owner._events[ctx.split :]:
                it.step(is_end, op)
            it.mover.finish()
        except BaseException:
            it.abort()
            raise
        finally:
            it.held.clear()
            it.grad = None
            del ctx.iteration
        return None, None, None


class CheckpointedChain(nn.Module):
    """A chain of stages (the last one the loss) that trains as a schedule says.

    ``module(x)`` returns the scalar loss of the chain's loss stage; ``loss.backward()`` replays
    the plan. Call it once per iteration (forward then backward): the plan holds the tensors of
    one iteration at a time.

    Attributes
    ----------
    schedule : Schedule
        The plan followed.
    names : list of str
        Stage names.
    counters : RuntimeCounters
        What the last iteration did.
    """

    def __init__(self, stages: Sequence[tuple[str, nn.Module]], schedule: Schedule) -> None:
        super().__init__()
        self.names = [name for name, _ in stages]
        self.modules_ = nn.ModuleList([module for _, module in stages])
        self.schedule = schedule
        self._events = _timeline(schedule.ops)
        self._side_streams: dict[Any, Any] = {}  # CUDA: the transfer stream of each device
        self._split = next(
            (i for i, (is_end, op) in enumerate(self._events) if op.op == "B" and not is_end),
            len(self._events),
        )
        self.counters = RuntimeCounters()
        self._forward_counts = planned_forward_counts(schedule, len(self.modules_))

    def planned_forward_counts(self) -> list[int]:
        """Forward operations per stage in the schedule."""
        return planned_forward_counts(self.schedule, len(self.modules_))

    def _static_pointers(self) -> set[int]:
        keys = (storage_key(t) for t in [*self.parameters(), *self.buffers()])
        return {key[0] for key in keys if key is not None}

    def forward(self, x: Tensor) -> Tensor:
        """Run the forward phase of the plan; returns the loss (a scalar tensor)."""
        if not torch.is_grad_enabled():
            raise RuntimeError("CheckpointedChain trains: call it with gradients enabled")
        n = len(self.modules_)
        self.counters = RuntimeCounters(
            forwards=[{} for _ in range(n)], backwards=[0] * n, saved_bytes=[0] * n
        )
        key = storage_key(x)
        self.counters.record(0 if key is None else key[1])
        # The anchor makes the loss require grad whatever x is, so that backward() reaches the
        # plan (the parameters are not inputs of the Function: their gradients are accumulated
        # by the torch.autograd.backward calls inside it, as in reentrant checkpointing).
        anchor = torch.empty(0, device=x.device, requires_grad=True)
        return _PlannedChain.apply(self, x, anchor)


# ------------------------------------------------------------------------------------------------


def _stages_of(
    model: Chain | nn.Module | Sequence[Any], example_input: Tensor | None
) -> list[tuple[str, nn.Module]]:
    if isinstance(model, Chain):
        return list(model.stages)
    if isinstance(model, nn.Sequential) and example_input is None:
        return [
            (f"stage{name}" if name.isdigit() else name, module)
            for name, module in model.named_children()
        ]
    if isinstance(model, nn.Module):
        if example_input is None:
            raise InputError(
                "checkpointed: give example_input to linearize the model, or pass a "
                "memplan.torch.Chain (linearize(model, x)) or a list of stages ending with the loss"
            )
        return list(linearize(model, example_input).stages)
    stages = list(model)
    out: list[tuple[str, nn.Module]] = []
    for i, item in enumerate(stages):
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
    stages = _stages_of(model, example_input)
    check_schedule(sched, [name for name, _ in stages], profile)
    return CheckpointedChain(stages, sched)


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
    if profile is None:
        prof = profile_model(
            module, example_input=x, device=str(x.device), repeats=repeats, name=label
        )
    else:
        prof = memplan.load_profile(profile)
    sched = memplan.solve(
        prof, algo=algo, memory=memory, slots=slots, optimizer=optimizer, bandwidth=bandwidth
    )
    if not sched.feasible:
        least = "" if sched.min_memory is None else "; the least memory that fits is "
        least += "" if sched.min_memory is None else f"{sched.min_memory} bytes"
        raise InputError(f"no {algo} plan fits in {memory}{least}")
    chain = linearize(module, x, labels=labels)
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
