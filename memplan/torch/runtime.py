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

Offloading schedules (``family: offload``) run ``F_all``/``B`` in order; the stages whose
``s[k]`` (or ``x[0]``, stage 0) the plan offloads run under ``saved_tensors_hooks`` that copy
what autograd saves (parameters excepted) to host memory, pinned and non-blocking on CUDA, and
back when the backward unpacks it (like ``torch.autograd.graph.save_on_cpu``). On CPU the copy is
a no-op (the tensor is already in host memory). Prefetches happen when autograd unpacks, not at
the plan's times.

Every iteration fills :class:`RuntimeCounters` (docs/runtime.md): forward computations per stage,
and the bytes of the activations the plan holds (``x[0]``, standalone ``x[k]``, ``s[k]`` measured
through ``saved_tensors_hooks``) over the iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.schedule import Schedule, load_schedule
from memplan.torch.linearize import Chain, linearize

__all__ = ["CheckpointedChain", "RuntimeCounters", "checkpointed", "fit"]

_FORWARD_OPS = ("F_all", "F_ck", "F_n")


def _identity(value: Any) -> Any:
    return value


def _storage_key(tensor: Tensor) -> tuple[int, int] | None:
    try:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    return (ptr, storage.nbytes()) if ptr else None


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
        Bytes of the activations held now: ``x[0]``, standalone ``x[k]`` and ``s[k]``.
    peak_live_bytes : int
        Largest ``live_bytes`` during the iteration, counted at the end of each forward, before
        ``F_n`` drops its input.
    live_curve : list of int
        ``live_bytes`` after each operation (at the same point as the peak).
    offloaded_bytes : int
        Bytes copied to host memory by the offloading hooks (0 on CPU: nothing moves).
    """

    forwards: list[dict[str, int]] = field(default_factory=list)
    backwards: list[int] = field(default_factory=list)
    saved_bytes: list[int] = field(default_factory=list)
    live_bytes: int = 0
    peak_live_bytes: int = 0
    live_curve: list[int] = field(default_factory=list)
    offloaded_bytes: int = 0

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


@dataclass
class _Saved:
    """``s[k]``: the detached input of stage ``k`` (a leaf), its output and graph."""

    inp: Tensor
    out: Tensor
    nbytes: int


class _Iteration:
    """The tensors one planned iteration holds (docs/model.md), and the counters."""

    def __init__(self, owner: CheckpointedChain, x0: Tensor) -> None:
        self.owner = owner
        self.counters = owner.counters
        self.static = owner._static_pointers()
        self.x: dict[int, Tensor] = {0: x0}
        self.s: dict[int, _Saved] = {}
        self.grad: Tensor | None = None
        self.rng: dict[int, tuple[Tensor, Tensor | None]] = {}
        self.x0_key = _storage_key(x0)

    # -- bookkeeping -----------------------------------------------------------------------
    def live(self) -> int:
        total, seen = 0, set()
        for tensor in self.x.values():
            key = _storage_key(tensor)
            if key is not None and key[0] not in seen:
                seen.add(key[0])
                total += key[1]
        return total + sum(s.nbytes for s in self.s.values())

    def input_of(self, k: int) -> Tensor:
        if k in self.x:
            return self.x[k]
        if k - 1 in self.s:
            return self.s[k - 1].out.detach()
        raise RuntimeError(f"stage {k}: its input x[{k}] is not in memory (the plan is invalid)")

    @contextmanager
    def _replay_state(self, k: int, device: torch.device) -> Iterator[None]:
        """First forward of a stage: remember the RNG state. Later ones: restore it, and the
        stage's buffers afterwards (batch-norm statistics are updated once)."""
        cuda = device.type == "cuda"
        if k not in self.rng:
            self.rng[k] = (
                torch.get_rng_state(),
                torch.cuda.get_rng_state(device) if cuda else None,
            )
            yield
            return
        cpu_state, cuda_state = self.rng[k]
        buffers = [(b, b.detach().clone()) for b in self.owner.modules_[k].buffers()]
        with torch.random.fork_rng(devices=[device] if cuda else []):
            torch.set_rng_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, device)
            yield
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)

    # -- operations ------------------------------------------------------------------------
    def forward(self, name: str, k: int) -> None:
        module = self.owner.modules_[k]
        src = self.input_of(k)
        self.counters.forwards[k][name] = self.counters.forwards[k].get(name, 0) + 1
        if name == "F_all":
            inp = src.detach()
            if k > 0 and inp.is_floating_point():
                inp.requires_grad_(True)
            saved: dict[int, int] = {}
            excluded = set(self.static)
            key = _storage_key(inp)
            if key is not None:
                excluded.add(key[0])

            # One pair of hooks (only the innermost saved_tensors_hooks apply): count what
            # autograd saves, then hand it to the offloading pair when the plan offloads it.
            move, restore = self.owner._offload_hooks(k, self.static, self.x0_key)

            def pack(tensor: Tensor) -> Any:
                key = _storage_key(tensor)
                if key is not None and key[0] not in excluded:
                    saved.setdefault(*key)
                return move(tensor)

            hooks = torch.autograd.graph.saved_tensors_hooks(pack, restore)
            with self._replay_state(k, src.device), torch.enable_grad(), hooks:
                out = module(inp)
            out_key = _storage_key(out)
            nbytes = sum(saved.values())
            if out_key is not None and out_key[0] not in saved:
                nbytes += out_key[1]
            self.counters.saved_bytes[k] = nbytes
            self.s[k] = _Saved(inp, out, nbytes)
            self.counters.record(self.live())
            return
        with self._replay_state(k, src.device), torch.no_grad():
            out = module(src)
        self.x[k + 1] = out
        self.counters.record(self.live())
        if name == "F_n" and k > 0:
            self.x.pop(k, None)

    def backward(self, k: int) -> None:
        saved = self.s.pop(k, None)
        if saved is None:
            raise RuntimeError(f"B {k}: s[{k}] is not in memory (the plan is invalid)")
        self.counters.backwards[k] += 1
        if saved.out.requires_grad:
            torch.autograd.backward(saved.out, self.grad)
        self.grad = saved.inp.grad if saved.inp.requires_grad else None
        del saved
        self.x.pop(k, None)
        self.x.pop(k + 1, None)
        self.counters.record(self.live())


class _PlannedChain(torch.autograd.Function):
    """Forward phase in ``forward``, the rest of the plan in ``backward`` (reentrant)."""

    @staticmethod
    def forward(ctx: Any, owner: CheckpointedChain, x0: Tensor, anchor: Tensor) -> Tensor:
        it = _Iteration(owner, x0)
        ops = owner._compute_ops
        first_b = next((i for i, (name, _) in enumerate(ops) if name == "B"), len(ops))
        for name, k in ops[:first_b]:
            it.forward(name, k)
        last = len(owner.modules_) - 1
        if last not in it.s:
            raise InputError(
                f"the plan does not run F_all on the loss stage ({last}) before its first B"
            )
        ctx.iteration = it
        ctx.rest = ops[first_b:]
        return it.s[last].out.detach()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[None, None, None]:
        it: _Iteration = ctx.iteration
        it.grad = grad_loss
        for name, k in ctx.rest:
            if name == "B":
                it.backward(k)
            else:
                it.forward(name, k)
        it.x.clear()
        it.s.clear()
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
        compute = sorted(
            (op for op in schedule.ops if op.stream == "compute"),
            key=lambda op: op.start,
        )
        self._compute_ops = [(op.op, op.stage) for op in compute]
        self._offloaded: set[int] = set()
        self._offload_x0 = False
        for op in schedule.ops:
            if op.op == "offload":
                if op.tensor == "x[0]":
                    self._offload_x0 = True
                else:
                    self._offloaded.add(op.stage)
        self.counters = RuntimeCounters()

    def planned_forward_counts(self) -> list[int]:
        """Forward operations per stage in the schedule."""
        return planned_forward_counts(self.schedule, len(self.modules_))

    def _static_pointers(self) -> set[int]:
        keys = (_storage_key(t) for t in [*self.parameters(), *self.buffers()])
        return {key[0] for key in keys if key is not None}

    def _offload_hooks(
        self, k: int, static: set[int], x0_key: tuple[int, int] | None
    ) -> tuple[Callable[[Tensor], Any], Callable[[Any], Tensor]]:
        """The (pack, unpack) pair of stage ``k``: identity unless the plan offloads from it."""
        if k not in self._offloaded and not (k == 0 and self._offload_x0):
            return _identity, _identity
        whole = k in self._offloaded
        counters = self.counters

        def pack(tensor: Tensor) -> Any:
            key = _storage_key(tensor)
            if key is None or key[0] in static:
                return tensor
            if not whole and (x0_key is None or key[0] != x0_key[0]):
                return tensor  # only x[0] is offloaded from this stage
            if tensor.device.type == "cpu":
                return tensor  # already in host memory: nothing to move
            host = torch.empty(
                tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=True
            )
            host.copy_(tensor, non_blocking=True)
            counters.offloaded_bytes += tensor.numel() * tensor.element_size()
            return (tensor.device, host)

        def unpack(packed: Any) -> Tensor:
            if isinstance(packed, tuple):
                device, host = packed
                return host.to(device, non_blocking=True)
            return packed

        return pack, unpack

    def forward(self, x: Tensor) -> Tensor:
        """Run the forward phase of the plan; returns the loss (a scalar tensor)."""
        if not torch.is_grad_enabled():
            raise RuntimeError("CheckpointedChain trains: call it with gradients enabled")
        n = len(self.modules_)
        self.counters = RuntimeCounters(
            forwards=[{} for _ in range(n)], backwards=[0] * n, saved_bytes=[0] * n
        )
        key = _storage_key(x)
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
        Infeasible schedule, a family the runtime cannot run, a different number of stages, or a
        profile whose sha256, model name or stage names differ from the schedule's.
    """
    if not schedule.feasible:
        raise InputError(
            f"the {schedule.algorithm} schedule is infeasible (feasible: false): nothing to run"
        )
    if schedule.family not in ("chain", "offload"):
        raise InputError(f"schedule family {schedule.family!r}: the runtime runs chain and offload")
    stages = schedule.profile.stages
    if stages is not None and stages != len(names):
        raise InputError(
            f"the schedule was made for {stages} stages ({schedule.profile.model}), "
            f"the model has {len(names)}"
        )
    bad = [op for op in schedule.ops if op.stage >= len(names)]
    if bad:
        raise InputError(f"ops: stage {bad[0].stage} out of range for {len(names)} stages")
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
    example_input: Tensor | None = None,
    memory: int | str = "8GB",
    algo: str = "rotor",
    *,
    profile: Any | None = None,
    slots: int = 500,
    optimizer: str = "sgd",
    bandwidth: float | str | None = None,
    repeats: int = 3,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> tuple[CheckpointedChain, Schedule]:
    """Profile a model, solve for a budget and wrap it: ``profile -> solve -> checkpointed``.

    Parameters
    ----------
    model : str or nn.Module
        A model name of :data:`memplan.torch.models.MODELS` or a module.
    example_input : Tensor, optional
        The chain input (built from ``batch_size``/``input_shape`` for a name when omitted).
    memory, algo, slots, optimizer, bandwidth
        As in :func:`memplan.solve`.
    profile : optional
        A profile of this model to use instead of profiling it.
    repeats : int
        Timed repetitions per stage when profiling.
    batch_size, input_shape
        For a model given by name without ``example_input``.

    Returns
    -------
    (CheckpointedChain, Schedule)
        The wrapped chain and the plan it follows.

    Raises
    ------
    InputError
        Bad input, or no plan of ``algo`` fits ``memory`` (the message says the least memory).
    """
    import memplan
    from memplan.torch.models import build_model
    from memplan.torch.profiler import profile_model

    if isinstance(model, str):
        module, x, label = build_model(model, batch_size=batch_size, input_shape=input_shape)
        if example_input is not None:
            x = example_input
    else:
        if example_input is None:
            raise InputError("fit: example_input is required with a module")
        module, x, label = model, example_input, type(model).__name__.lower()
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
    chain = linearize(module, x)
    return checkpointed(chain, sched, profile=prof), sched


def planned_activation_peak(profile: Any, schedule: Schedule) -> int:
    """The plan's peak of held activations: what :class:`RuntimeCounters` measures on CPU.

    The simulator replays the schedule on a copy of the profile without temporary memory
    (``forward_overhead = backward_overhead = 0``), without gradients (``grad_size = 0``) and
    without static memory: its peak is then the largest total of ``x[0]``, the standalone
    ``x[k]`` and the ``s[k]`` held at once, counted when an operation has produced its output and
    before it frees anything (docs/runtime.md).
    """
    import memplan

    prof = memplan.load_profile(profile)
    data = prof.model_dump(exclude_none=True)
    for stage in data["stages"]:
        stage.update(forward_overhead=0, backward_overhead=0, grad_size=0)
    bare = memplan.load_profile(data)
    sched = schedule.model_copy(
        update={"static_memory": 0, "peak_memory": None, "profile": schedule.profile}
    )
    result = memplan.simulate(bare, sched, memory=None, check_claims=False)
    if not result.valid:
        raise InputError(f"the schedule does not replay on this profile: {result.violation}")
    return result.peak_memory
