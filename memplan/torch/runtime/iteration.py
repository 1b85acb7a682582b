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
* ``F_ck k`` / ``F_n k`` drop it: the pack hook gives autograd a :class:`Slot` instead of each
  saved tensor (parameters and buffers excepted), and the runtime holds the output ``x[k+1]``
  only as long as a later recomputation reads it;
* when the backward reaches stage ``k`` (a pre-hook on the node that produced the stage's
  output), the runtime runs the plan's events up to the start of ``B k``: the recomputations
  the plan puts there (``F_ck``/``F_n`` under ``no_grad``; ``F_all`` under ``enable_grad``,
  whose saved tensors fill the slots of stage ``k`` in the order they were packed) and the
  transfers; autograd then runs stage ``k``'s nodes, unpacking the slots, and frees each saved
  tensor when its node has run, as in plain training;
* a callback queued on the autograd engine runs what remains after ``B 0``;
* a recomputed ``F_all k`` whose autograd does not save its input lets go of the runtime's hold
  on ``x[k]`` (held for that recomputation), unless a later event reads it: as the chain model
  frees it (docs/model.md, "autograd's frees"), nothing but autograd holds it then, as in plain
  training (a batch norm's output read by a ReLU, which saves its own output).

Recomputations are exact: the first forward of each stage the plan runs more than once records
the RNG state and the autocast state; every later forward runs in
:func:`memplan.torch.runtime.recompute.recomputing` (the same RNG draws, the buffers updated once) under
the same autocast state, on an input that requires gradients as the original one did (ops save
what they save for that case). A stage that modifies its input in place is run on a copy when the
plan holds that input for a later recomputation.

Transfers (``offload``/``prefetch`` of ``x[k]`` or ``s[k]``, offloading and combined schedules)
run at the plan's points, in the order of the combined simulator (docs/combined.md, rule T5): an
offload copies the tensor's storages to host memory and frees them
(``UntypedStorage.resize_(0)``: every tensor and autograd saved tensor on them stays valid); a
prefetch resizes them back and copies the data in (:class:`memplan.torch.runtime.transfers.Mover`).

Every iteration fills :class:`RuntimeCounters` (docs/runtime.md): forward and backward
computations per stage, the bytes transferred, and, when it tallies, the bytes of device memory
the activations the plan holds occupy (``x[0]``, standalone ``x[k]``, ``s[k]``) as the plan
counts them.

NOTE [ What the runtime skips ]
-------------------------------
Where the plan keeps what plain training keeps, the runtime does nothing: a training step costs
what plain training's does (docs/benchmarks.md, ``bench_enable_overhead.py``).

* A stage the plan computes once, with ``F_all``, no selective policy, and whose ``s[k]`` no
  transfer moves (:attr:`RuntimePlan.plain <memplan.torch.runtime.plan.RuntimePlan>`) runs
  without ``saved_tensors_hooks``: autograd keeps what it saves, exactly as it does without a
  plan, and unpacks it without a Python call. The runtime holds its output only when a later
  recomputation reads it (``keeps``), as for every stage. Correct because nothing of the plan
  touches such a stage's saved tensors: no slot to fill, nothing to offload; ``B k`` frees
  them as autograd does.
* The backward's pre-hook is registered only on the stages where the plan acts when the
  backward reaches them (:attr:`RuntimePlan.watched`: a recomputation or a transfer before
  ``B k``, a tensor the runtime holds to hand over); the events of the others (the start and end
  of their ``B``) only count, and run at the next watched stage or after the backward. Correct
  because such an event frees nothing the runtime holds: ``s[k]`` of a plain stage is
  autograd's alone, and ``x[k+1]`` of a plain stage is never a tensor of its own.
* The parameters' and buffers' storages (never part of ``s[k]``) are looked up only when a
  stage's saved tensors are (:attr:`PlannedIteration.static`), from the module list kept at
  installation.
* A plan whose every stage is plain, that holds nothing for a recomputation and moves nothing
  (:attr:`RuntimePlan.passive`: a store-all plan) runs no iteration at all:
  :class:`PassiveIteration` lets the model's forward and autograd's backward run untouched, and
  the module hooks that mark the stages are not even registered (only the model's own call is
  watched, to check the batch); it counts every stage's forward once when the forward returns
  and every backward once when a backward from the output ends.
* The bytes (``saved_bytes``, ``live_bytes``, ``peak_live_bytes``, ``live_curve``) are counted
  only when asked (``tally``: :func:`memplan.torch.checkpointed` ``(..., tally=True)``,
  ``memplan.torch.planned(model).tally = True``, ``memplan run``): counting them looks at every
  tensor autograd saves, in every stage, and sums the held storages at every event of the plan.

NOTE [ A recomputation stops at its last saved tensor ]
-------------------------------------------------------
A recomputed ``F_all k`` exists to fill the slots of stage ``k``'s first forward. When its output
is not kept (no later recomputation reads ``x[k+1]``, no transfer moves it: the plan's ``keeps``),
nothing reads what the stage computes after the last tensor autograd saves, so the recomputation
stops there: the pack hook that fills the last slot raises :class:`_Recomputed`, which
:meth:`PlannedIteration._fill_slots` catches (the same count of saved tensors as the first
forward, by construction). This is what ``torch.utils.checkpoint`` does by default (its "early
stop"), and why memplan's plan, with the same recomputations as per-block checkpointing, ran
slower than it: a Llama block's last matrix product (the MLP's down projection, a quarter of the
block's) saves its input before it computes, so neither recomputes it, nor the residual sum after
it. The output is then never made: ``x[k+1]`` is not in memory while ``B k`` runs (the plan
counts it in ``s[k]``, an upper bound; the counters count it, from the first forward's output,
:attr:`StageRun.output_bytes`, when they tally, unless the first forward's last saved tensor
was the output).
Everything the context managers around the stage function do on the way out runs as on an
error: the RNG state and the buffers are restored, FSDP2 reshards what the recomputation gathered
(:meth:`~memplan.torch.runtime.fsdp.ShardedSteps.recomputing`), and FSDP2's post-forward hook of a
unit does not run, as under ``torch.utils.checkpoint``'s early stop (its pre-backward hook, which
comes next for the unit, sets the unit's state; in the backward the post-forward hook would not
reshard anyway).

This module is longer than 600 lines on purpose: it is one class, a state machine whose
methods (forward brackets, recomputation, transfers, the backward's hooks) share its state and
follow the rules of the NOTE above together; the plan it reads, the slots and the chain that
drives it are in :mod:`~memplan.torch.runtime.plan`, :mod:`~memplan.torch.runtime.slots` and
:mod:`~memplan.torch.runtime.checkpointed`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from memplan.torch.base.storage import StaticStorages, storage_key
from memplan.torch.runtime.plan import (
    COMPUTE_OPS,
    RuntimeCounters,
    RuntimePlan,
    StageFunction,
    stored_name,
    tensor_name,
)
from memplan.torch.runtime.recompute import recomputing, rng_snapshot
from memplan.torch.runtime.selective import cached_storages
from memplan.torch.runtime.slots import (
    SelectiveForward,
    Slot,
    StageRun,
    autocast_state,
    unpack_slot,
)
from memplan.torch.runtime.transfers import (
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


class _Recomputed(Exception):  # noqa: N818 (a signal, not an error)
    """Raised by a recomputation's pack hook once every slot of the stage is filled (NOTE [ A
    recomputation stops at its last saved tensor ]).
    """


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
    static : callable
        Returns the data pointers of the parameters and buffers (never part of ``s[k]``); called
        only when a stage's saved tensors are looked at.
    counters : RuntimeCounters
        Filled during the iteration.
    streams : dict
        CUDA side streams, one per device (kept by the owner across iterations).
    virtual : set of int
        Stages computed outside the runtime (their ops are counted, not run).
    tally : bool
        Count the bytes of what the plan holds too (``saved_bytes``, ``live_bytes``,
        ``peak_live_bytes``, ``live_curve``): every stage's saved tensors are then looked at, as
        the plan counts them (NOTE [ What the runtime skips ]).
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
        static: Callable[[], Container[int]],
        counters: RuntimeCounters,
        streams: dict[Any, Any],
        *,
        virtual: set[int] | None = None,
        tally: bool = False,
        inplace: Sequence[bool] | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        self.plan = plan
        self.counters = counters
        self._statics = static
        self._static: Container[int] | None = None
        self.virtual = virtual or set()
        self.tally = tally
        # the stages whose saved tensors the runtime looks at, whose backward it watches
        self.hooked = [True] * plan.stages if tally else [not p for p in plan.plain]
        self.watched = [True] * plan.stages if tally else plan.watched
        self.inplace = list(inplace) if inplace is not None else [False] * plan.stages
        self.names = list(names) if names is not None else [str(k) for k in range(plan.stages)]
        self.mover = Mover(x0.device, streams)
        self.device = x0.device
        self.held: dict[str, Stored] = {}
        self.held["x[0]"] = make_stored(
            "x[0]", x0, [x0.untyped_storage()], ready=self.mover.produced()
        )
        self.runs = [StageRun() for _ in range(plan.stages)]
        self.pos = 0
        self.running: tuple[str, int] | None = None
        self.leaving: list[Stored] = []
        self.hooks: Any = None  # the saved_tensors_hooks of the stage being computed
        self.saved: dict[int, torch.UntypedStorage] = {}
        self.inputs: set[int] = set()  # the storages of the stage's input: not part of s[k]
        # the data pointer of s[k]'s output x[k+1] when the runtime holds it only for a later
        # recomputation (autograd did not save it)
        self.readers_only: dict[str, int] = {}
        self.queued = False
        self.done = False
        self._record()

    # -- bookkeeping -----------------------------------------------------------------------
    @property
    def static(self) -> Container[int]:
        """Data pointers of the parameters and buffers (taken once, when first needed; each
        while its storage lives: :class:`~memplan.torch.base.storage.StaticStorages`).
        """
        if self._static is None:
            self._static = self._statics()
        return self._static

    def _record(self) -> None:
        if self.tally:
            self.counters.record(self.live())

    def live(self) -> int:
        """Bytes of the stored tensors, as the plan counts them (shared storages once); an
        ``s[k]`` handed over to its backward counts by the sizes it had (autograd frees its
        storages as the backward goes, and the allocator may reuse their addresses).
        """
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
        ``s[k-1]``); a RuntimeError when the plan has it nowhere in device memory.
        """
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

    def finished(self, out: Tensor | None) -> None:
        """The model's forward has returned ``out`` (the backward follows the plan by itself)."""
        return None

    def abort(self) -> None:
        """After an error: put the input back in device memory (it is the caller's tensor),
        leave the stage being computed, forget the plan's tensors.
        """
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
        if self.inplace[k] and self._holds(x):
            x = x.clone()
        if self.hooked[k] or sweep.start in self.plan.keeps:  # its output may be the input's
            key = storage_key(x)
            self.inputs = set() if key is None else {key[0]}
        if not self.hooked[k]:  # autograd keeps what it saves, as in plain training
            return x
        if sweep.op == "F_all" and policy is None:
            self.saved = {}
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_kept, unpack_slot)
        elif sweep.op == "F_all":
            run.slots = []
            hooks = SelectiveForward(policy, self._pack_dropped(k), run)
        else:
            run.slots = []
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_dropped(k), unpack_slot)
        hooks.__enter__()
        self.hooks = hooks
        return x

    def end(self, k: int, out: Tensor) -> None:
        """The model has computed stage ``k``: store what the plan stores, run the plan's events
        up to the end of the computation, and wait for the backward to reach the stage.
        """
        if self.hooks is not None:
            self.hooks.__exit__(None, None, None)
            self.hooks = None
        sweep = self.plan.sweep[k]
        if not isinstance(out, Tensor):
            raise RuntimeError(f"stage {k} ({self.names[k]}) returned {type(out).__name__}")
        if k in self.plan.policies and sweep.op == "F_all":
            self.saved = self._cached(k)
        run = self.runs[k]
        if run.function is not None and self.tally:  # recomputed later: what the counters
            run.output_bytes = self._output_bytes(out, run)  # count for its output
        self._store(sweep.op, k, out, self.saved, keep=sweep.start in self.plan.keeps)
        self.saved = {}
        self._record()  # the output counts from the computation's start
        if out.grad_fn is not None and self.watched[k]:
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

    def _output_bytes(self, out: Tensor, run: StageRun) -> int:
        """The bytes of a first forward's output ``s[k]`` counts besides its saved tensors."""
        key = storage_key(out)
        last = None if run.last_saved is None else run.last_saved()
        if key is None or (last is not None and last.data_ptr() == key[0]):
            return 0  # the output is the last tensor saved: the recomputation makes it
        return key[1] if self._owned(key[0]) else 0

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
        run = self.runs[k]
        slots = run.slots

        def pack(tensor: Tensor) -> Any:
            key = storage_key(tensor)
            if key is not None and key[0] in self.static:
                return tensor  # parameters and buffers stay: they are not the plan's to drop
            slot = Slot(k)
            slots.append(weakref.ref(slot))  # autograd's node holds it
            if self.tally:  # the counters only (NOTE [ A recomputation stops ... ])
                run.last_saved = None if key is None else weakref.ref(tensor.untyped_storage())
            return slot

        return pack

    def _store(
        self,
        name: str,
        k: int,
        out: Tensor | None,
        saved: dict[int, torch.UntypedStorage],
        keep: bool,
    ) -> None:
        """Hold what a forward of stage ``k`` stores: ``s[k]`` (the storages autograd saved,
        the output) or ``x[k+1]``; the output's data only when ``keep`` (a later recomputation
        reads it, a transfer moves it).
        """
        target = stored_name(name, k)
        if target in self.held:
            raise RuntimeError(f"{name} {k}: {target} is already held (the plan is invalid)")
        out_key = None if out is None else storage_key(out)
        storages = list(saved.values())
        counted = 0
        if name == "F_all":
            nbytes = sum(storage.nbytes() for storage in storages)
            if out is None:  # a recomputation stopped before its output (NOTE [ A
                nbytes += self.runs[k].output_bytes  # recomputation stops ... ])
                counted = self.runs[k].output_bytes if self.tally else 0
            elif out_key is not None and out_key[0] not in saved:
                nbytes += out_key[1]  # x[k+1] is part of s[k] (the profiler's saved_size)
                if (keep or self.tally) and self._owned(out_key[0]):
                    if keep:
                        storages.append(out.untyped_storage())
                        self.readers_only[target] = out_key[0]
                    else:
                        counted = out_key[1]
            if self.tally:
                self.counters.saved_bytes[k] = nbytes
        elif out is not None and out_key is not None:
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
        if op.op in COMPUTE_OPS:
            if is_end:
                self.finish(op.op, k)
            elif op.op == "B":
                self.backward(k)
            elif k in self.virtual and self.pos - 1 == self.plan.sweep[k].start:
                self._count(op.op, k)  # the user's loss: autograd computes it
                self.running = (op.op, k)
                target = stored_name(op.op, k)
                self.held[target] = make_stored(target, None, [])
            elif self.pos - 1 == self.plan.sweep[k].start:
                raise RuntimeError(
                    f"stage {k} ({self.names[k]}) was not computed when the plan needed it "
                    "(the model's forward did not reach it)"
                )
            else:
                self.recompute(op.op, k)
        elif op.tensor == "x[0]" and not self.plan.input_transfers:
            return
        elif is_end:
            self.transfer_end(op.op, tensor_name(op))
        else:
            self.transfer_start(op.op, tensor_name(op))
        self._record()

    @contextmanager
    def _replay(self, k: int) -> Iterator[None]:
        """A recomputation of stage ``k``: the RNG state and the autocast state of its first
        forward, its buffers restored afterwards (:func:`recomputing`).
        """
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
            forward = SelectiveForward(policy, lambda tensor: None, run)
            with self._replay(k), torch.enable_grad(), forward:
                out = run.function(inp)
            self._store("F_all", k, out.detach(), self._cached(k), keep)
            return
        packed: list[Tensor | None] = []
        saved: dict[int, torch.UntypedStorage] = {}
        source = storage_key(src)
        reads_input = False

        def pack(tensor: Tensor) -> None:
            nonlocal reads_input
            # Detached: a recomputed tensor must not refer to the recomputation's graph, whose
            # saved-tensor hooks refer to this list (a cycle through autograd that would keep
            # every recomputed tensor until the last one is freed).
            key = storage_key(tensor)
            if key is not None and key[0] in self.static:
                return  # a parameter: the first forward kept it too (told apart when packed:
                # FSDP2 frees a block's gathered ones after it)
            if not self._slot_alive(k, len(packed)):
                packed.append(None)  # a branch autograd let go (:meth:`_slot_alive`)
                return
            packed.append(tensor.detach())
            if key is not None and self._owned(key[0]):
                saved.setdefault(key[0], tensor.untyped_storage())
            reads_input |= key is not None and source is not None and key[0] == source[0]

        out = self._fill_slots(k, inp, pack, packed, stop=not keep)
        self._store("F_all", k, out, saved, keep)
        saved.clear()  # as ``packed``: what the plan holds is in self.held now
        if not reads_input:
            self._autograd_frees(k)

    def _slot_alive(self, k: int, index: int) -> bool:
        """Whether slot ``index`` of stage ``k``'s first forward is still held by autograd.

        A node of a branch that nothing reads (MiniMax's lightning attention computes the
        key-value state of a next chunk of the sequence that training never uses) is let go at
        the end of the first forward with its slots: the recomputation keeps nothing for them,
        as the profile measured the forward (their tensors freed with the branch). Held until
        the recomputation's end, they measured 64 KB above the plan. An index past the slots
        is kept, for :meth:`_fill_slots`'s error.
        """
        slots = self.runs[k].slots
        return index >= len(slots) or slots[index]() is not None

    def _fill_slots(
        self,
        k: int,
        inp: Tensor,
        pack: Callable[[Tensor], None],
        packed: list[Tensor | None],
        stop: bool = False,
    ) -> Tensor | None:
        """Run stage ``k`` on ``inp`` with gradients (under its SAC recomputation context when
        it is selective) and put what autograd saves into the slots of its first forward;
        returns the output, detached, or None when ``stop`` and the stage stopped at its last
        saved tensor (NOTE [ A recomputation stops at its last saved tensor ]).
        """
        run = self.runs[k]
        last = len(run.slots) if stop else 0

        def packing(tensor: Tensor) -> None:
            before = len(packed)
            pack(tensor)
            if len(packed) == last and before < last:
                raise _Recomputed

        hooks = torch.autograd.graph.saved_tensors_hooks(packing if last else pack, unpack_slot)
        replay = run.recompute.recompute if run.recompute is not None else nullcontext()
        out: Tensor | None = None
        try:
            with self._replay(k), torch.enable_grad(), hooks, replay:
                out = run.function(inp)
        except _Recomputed:
            pass
        slots = [ref() for ref in run.slots]
        dropped = len(slots)
        kept = packed  # the tensors that are not parameters or buffers, as the pack hooks saw
        if len(kept) != dropped:
            raise RuntimeError(
                f"stage {k} ({self.names[k]}): its recomputation saved {len(kept)} tensors for "
                f"the backward, its forward {dropped}: the stage does not compute the same way "
                "twice (a data-dependent branch?); memplan cannot recompute it"
            )
        for slot, tensor in zip(slots, kept, strict=True):
            if slot is not None:
                slot.value = tensor
        # The recomputation's graph refers to ``packed`` through its saved-tensor hooks: a
        # recomputed tensor that outlives the call (one the block stores in a mapping or an
        # attribute) would keep every tensor of the list, which the slots hold now, alive
        packed.clear()
        run.slots = []
        run.recompute = None
        return None if out is None else out.detach()

    def _autograd_frees(self, k: int) -> None:
        """A recomputed ``F_all k`` whose autograd did not save its input ``x[k]``: let go of the
        runtime's hold on it (the standalone checkpoint, or ``s[k-1]``'s output kept for this
        recomputation), as the chain model does at the end of ``F_all k`` (docs/model.md,
        "autograd's frees"). The memory is then autograd's alone: freed unless the stage before
        saved it, as in plain training. The bytes stay counted (``counted``) for the counters,
        which follow the plan's activations.
        """
        if k == 0 or k in self.plan.reread:
            return  # the chain input (the caller's), or an input a later forward reads again
        before = self.held.get(f"s[{k - 1}]")
        ptr = self.readers_only.pop(f"s[{k - 1}]", None)
        if before is not None and ptr is not None and before.place == GPU:
            _release(before, [s for s in before.storages if s.data_ptr() == ptr])
        standalone = self.held.get(f"x[{k}]")
        if standalone is not None and standalone.place == GPU:
            _release(standalone, list(standalone.storages))

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
        outputs taken from the cache, what autograd saves put into the slots.
        """
        inp = self.input_of(k).detach()
        run = self.runs[k]
        if run.requires_grad:
            inp.requires_grad_(True)
        if self.inplace[k]:
            with torch.enable_grad():
                inp = inp.clone()
        packed: list[Tensor | None] = []

        def pack(tensor: Tensor) -> None:
            key = storage_key(tensor)
            if key is None or key[0] not in self.static:
                alive = self._slot_alive(k, len(packed))
                packed.append(tensor.detach() if alive else None)

        self._fill_slots(k, inp, pack, packed, stop=True)

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

    def reached_through(self, k: int, tensor: Tensor) -> None:
        """``tensor``, which stage ``k`` computed besides its output, is read by later stages
        with a gradient (a position bias every block reads: NOTE [ A side input with a
        gradient ] in :mod:`memplan.torch.split.repeated`): the backward may reach the stage's
        nodes through it before its output's, once every reader's backward has run (autograd
        orders ready nodes by creation). Run the plan up to ``B k`` there too.
        """
        if tensor.grad_fn is not None and self.watched[k]:
            tensor.grad_fn.register_prehook(self._backward_reaches(k))

    # -- the backward ----------------------------------------------------------------------
    def _backward_reaches(self, k: int) -> Callable[[Any], None]:
        def prehook(grad_outputs: Any) -> None:
            self.reach_backward(k)

        return prehook

    def reach_backward(self, k: int) -> None:
        """The backward reaches stage ``k``: run the plan's events up to the start of ``B k``.

        Called by the pre-hook of the node that produced the stage's output, or earlier by a
        caller that must run the plan first (:mod:`memplan.torch.runtime.fsdp`); a second call
        does nothing.
        """
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


def _release(stored: Stored, storages: list[torch.UntypedStorage]) -> None:
    """Drop the runtime's references to ``storages`` of ``stored`` (and to its tensor), their
    bytes still counted as the plan counts them.
    """
    stored.counted += sum(storage.nbytes() for storage in storages)
    stored.storages = [s for s in stored.storages if all(s is not t for t in storages)]
    stored.sizes = [s.nbytes() for s in stored.storages]
    stored.tensor = None


def static_pointers(modules: Iterable[nn.Module]) -> StaticStorages:
    """The storages of the parameters and buffers of ``modules`` (each module's own: pass every
    module, ``list(model.modules())``, kept from one step to the next), by data pointer, each
    for as long as it lives (a buffer the step replaces stops counting when freed).
    """
    found = StaticStorages()
    for module in modules:
        for tensors in (module._parameters, module._buffers):
            for tensor in tensors.values():
                if tensor is not None:
                    found.add(tensor)
    return found


class PassiveIteration:
    """One training iteration under a plan that keeps what plain training keeps
    (:attr:`RuntimePlan.passive <memplan.torch.runtime.plan.RuntimePlan>`): the model's forward
    and autograd's backward run untouched; the runtime only counts (NOTE [ What the runtime
    skips ]). The same brackets as :class:`PlannedIteration`, which do nothing.
    """

    def __init__(self, plan: RuntimePlan, counters: RuntimeCounters) -> None:
        self.plan = plan
        self.counters = counters
        self.queued = False

    def begin(self, k: int, x: Tensor, function: Any = None, module: Any = None) -> Tensor:
        return x

    def end(self, k: int, out: Tensor) -> None:
        return None

    def reached_through(self, k: int, tensor: Tensor) -> None:
        return None

    def abort(self) -> None:
        return None

    def finished(self, out: Tensor | None) -> None:
        """The model's forward has returned ``out``: every stage was computed once; the
        backward's end is counted when a backward from ``out`` completes.
        """
        self.counters.forwards = [{"F_all": 1} for _ in range(self.plan.stages)]
        if out is not None and out.grad_fn is not None:
            out.grad_fn.register_prehook(self._reached)

    def _reached(self, grad_outputs: Any) -> None:
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._complete)

    def _complete(self) -> None:
        self.queued = False
        self.counters.backwards = [b + 1 for b in self.counters.backwards]
