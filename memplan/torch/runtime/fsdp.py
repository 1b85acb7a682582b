"""A plan on a model sharded with FSDP2 (``fully_shard``): its layout, its recomputations.

NOTE [ Plans under FSDP2 ]
--------------------------
memplan plans one rank of a model sharded with PyTorch's FSDP2 over ``N`` ranks, one
``fully_shard`` per block and one on the root, from the profile of the whole model
(:func:`memplan.profile.sharding.shard_profile`, NOTE [ FSDP2 memory terms ]). This module gives
the planner the layout of a real model (:func:`model_layout`: every stage's parameters, their
shards as FSDP2 pads them, which stages are blocks) and the runtime what FSDP2 needs
(:class:`ShardedSteps`):

* **Recomputations all-gather what they need.** A recomputed block is called as a module, so
  FSDP2's pre-forward hook all-gathers its parameters, as under FSDP2's own activation
  checkpointing. Inside the backward FSDP2's post-forward hook does not reshard them (it expects
  the block's backward next): memplan reshards a block it recomputed unless its backward is the
  next to run (``FSDPModule.reshard``). The recomputation's own graph is dropped (memplan keeps
  its saved tensors, not its graph), so FSDP2's post-backward hook (the reduce-scatter) runs once
  per block, from the graph of the step's forward, as does its pre-backward hook.
* **memplan recomputes before FSDP2's pre-backward hook.** FSDP2's pre-backward hook of a block
  runs on its output's gradient, before the node that produced it. memplan's recomputations for
  ``B k`` run first: a view of block ``k``'s output is what the next stage reads, and the plan's
  events up to ``B k`` run in a pre-hook of that view's node. Before recomputing a block other
  than ``k`` there, memplan drops the all-gather FSDP2 prefetched for block ``k`` (copied out and
  resharded; a recomputation of block ``k`` itself uses it): the window of ``B k`` holds the
  reduce-scatter input of block ``k+1`` alone (the terms' ``C[k+1]``), and every recomputation of
  a block gathers its own parameters, as the terms count.
* **A block cut into sub-blocks is one unit** (``enable(..., sub_blocks=True)``: NOTE [ A unit
  spanning stages ] in :mod:`memplan.profile.sharding`). A recomputed part is replayed from its
  operations, not called as a module, so no FSDP2 hook runs: memplan gathers the block first
  (``FSDPModule.unshard``, after dropping another block's prefetch as for a block), and
  reshards it after unless its backward is the next to run (:meth:`ShardedSteps.replaying`).
  A cut block with a ``fully_shard`` unit inside it is refused at the first sharded step.
* **The unsharded parameters are the model's, not the plan's.** A block's saved tensors include
  its unsharded parameters; memplan treats their storages as parameters (never part of ``s[k]``,
  never offloaded) through :meth:`ShardedSteps.static`.
* **A chunked loss is one root stage** (``enable(..., loss_chunks=N)``). The model's forward
  stops at its last block's return by an exception the model's own ``forward`` wrapper catches
  (:class:`~memplan.torch.runtime.hooks.ModelHooks`), raised by the block's last forward hook,
  registered anew at each step's start: after FSDP2's post-forward hook, which reshards the
  block and hooks its output for FSDP2's pre-backward, and after this module's own. The
  head+loss stage then runs inside the root's forward, on the root's parameters FSDP2 gathered
  at its pre-forward (the head's weight, tied to the embedding or not) and keeps gathered to
  the end of the backward; its gradients are the root's whole ones, reduce-scattered after
  ``B 0``. The root's post-forward hook runs on the model's output (its ``loss``), where FSDP2's
  root pre-backward hook prefetches the last block (``loss_in_root``).
* **Without FSDP2's backward prefetch where no plan with it fits** (NOTE [ Without the backward
  prefetch ] in :mod:`memplan.profile.sharding`). memplan plans with FSDP2's implicit backward
  prefetch first, and without it only when no plan with it fits the budget (:func:`_solved`);
  then the first sharded step turns it off on every unit of the model (each unit told to
  prefetch itself alone, a no-op), and ``disable`` gives the units back the lists they had.
  memplan drops no prefetch then (none is made).
* **The shard count can change after enable.** ``enable`` before ``fully_shard`` profiles the
  whole model (it is whole on every rank then); the first step on a sharded model checks the
  plan's layout against the model's (:func:`model_layout`) and plans again when they differ.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.loop import TrainingLoop
from memplan.profile.model import Profile
from memplan.profile.sharding import ShardLayout, StageShard, Unit, check_shards, shard_profile
from memplan.schedule import Schedule, load_schedule
from memplan.torch.base.storage import StaticStorages
from memplan.torch.runtime.checkpointed import check_schedule
from memplan.torch.runtime.hooks import with_primary
from memplan.torch.runtime.plan import RuntimePlan
from memplan.torch.runtime.planned import Target, install, planned, stage_modules
from memplan.torch.split.trace import primary_output

__all__ = [
    "ShardedSteps",
    "StageUnits",
    "collective_copies",
    "fsdp_blocks",
    "install_sharded",
    "is_sharded",
    "model_layout",
    "shard_count",
    "sharded_over",
]


def _fsdp_module_class() -> type | None:
    """FSDP2's ``FSDPModule``, when torch's FSDP2 is loaded (a model sharded with it is)."""
    if "torch.distributed.fsdp" not in sys.modules:
        return None
    from torch.distributed.fsdp import FSDPModule

    found: type = FSDPModule
    return found


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` is an FSDP2 unit (``fully_shard`` was applied to it)."""
    cls = _fsdp_module_class()
    return cls is not None and isinstance(module, cls)


def _class_name(module: nn.Module) -> str:
    """The name of a module's class, as the user wrote it (``fully_shard`` makes it a subclass
    named ``FSDP`` + its name, of ``FSDPModule`` and the class).
    """
    cls = type(module)
    return cls.__bases__[-1].__name__ if is_sharded(module) else cls.__name__


def _is_dtensor(tensor: Tensor) -> bool:
    return type(tensor).__name__ == "DTensor" and hasattr(tensor, "device_mesh")


def sharded_over(model: nn.Module) -> int | None:
    """The ranks ``model``'s parameters are sharded over by FSDP2 (None: not sharded)."""
    if _fsdp_module_class() is None or not any(is_sharded(m) for m in model.modules()):
        return None
    for param in model.parameters():
        if _is_dtensor(param):
            return int(param.device_mesh.size())
    return None


def collective_copies() -> int:
    """Extra copies the default process group's collectives make: gloo 1, NCCL 0.

    Measured on CPU (NOTE [ FSDP2 memory terms ]): gloo copies an all-gather's output and a
    reduce-scatter's input once.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        return 1
    return 0


def _stage_module(module: nn.Module | None) -> nn.Module | None:
    """The module a stage calls: a block call's block."""
    inner = getattr(module, "block", None)
    return inner if isinstance(inner, nn.Module) else module


def fsdp_blocks(model: nn.Module, modules: Sequence[nn.Module | None]) -> set[int]:
    """The stages whose module is an FSDP2 unit (not the root): ``modules`` are the stages'
    modules, or the modules whose units hold the stages (a block cut into sub-blocks).
    """
    found = set()
    for k, module in enumerate(modules):
        inner = _stage_module(module)
        if inner is not None and inner is not model and is_sharded(inner):
            found.add(k)
    return found


def model_layout(
    modules: Sequence[nn.Module | None],
    shards: int,
    blocks: set[int],
    copies: int = 0,
    loss_in_root: bool = True,
    spans: dict[int, int] | None = None,
) -> ShardLayout:
    """The layout of a chain whose stages call ``modules`` (None: no module, the loss).

    Each stage's parameters are those of its module that no earlier stage has (the profiler's
    rule for ``weight_size``); FSDP2 keeps ``ceil(rows / shards)`` rows of each parameter on every
    rank (NOTE [ FSDP2 memory terms ]; a sharded parameter's shape is the whole one).
    ``blocks``: the stages sharded as units; ``loss_in_root``: the model computes its loss
    (:class:`~memplan.profile.sharding.ShardLayout`); ``spans``: of the blocks' stages in a unit
    spanning several (a block cut into sub-blocks), the unit's first stage.
    """
    spans = spans or {}
    seen: set[int] = set()
    figures = []
    for k, module in enumerate(modules):
        params = [] if module is None else [p for p in module.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        total = shard = 0
        for param in params:
            shape = tuple(param.shape)
            rows = shape[0] if shape else 1
            row_bytes = math.prod(shape[1:]) * param.element_size()
            total += rows * row_bytes
            shard += math.ceil(rows / shards) * row_bytes
        unit: Unit = "block" if k in blocks else "root"
        first = spans.get(k) if k in blocks else None
        figures.append(StageShard(total, shard, shard * shards, unit, first))
    return ShardLayout(shards, tuple(figures), copies, loss_in_root)


def _in_backward() -> bool:
    """Whether autograd's engine runs a backward on this thread (FSDP2's own test)."""
    return bool(torch._C._current_graph_task_id() != -1)


class _Block:
    """A block's FSDP2 unit and where its parameters are registered.

    FSDP2 swaps the sharded and the unsharded ones in place at every all-gather and reshard.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.places = [
            (owner, name)
            for owner in module.modules()
            for name, _ in owner.named_parameters(recurse=False)
        ]

    def first(self) -> Tensor:
        owner, name = self.places[0]
        return getattr(owner, name)

    def gathered(self) -> bool:
        """Whether its parameters are unsharded (FSDP2 registers them as plain tensors)."""
        return bool(self.places) and not _is_dtensor(self.first())

    def pointers(self) -> set[int]:
        """The data pointers of its unsharded parameters (none while sharded)."""
        if not self.gathered():
            return set()
        return {getattr(o, n).untyped_storage().data_ptr() for o, n in self.places}


class ShardedSteps:
    """What the runtime does for FSDP2 (NOTE [ Plans under FSDP2 ]), for one planned model.

    Parameters
    ----------
    planned : PlannedModel
        The plan installed on the model (``planned.sharding`` is set to this).
    modules : sequence of nn.Module or None
        The module each stage of the chain calls (None for the loss).
    layout : ShardLayout
        The layout the plan was made for.
    replan : callable, optional
        ``replan(layout)`` plans again for another layout, installs the plan and returns the
        layout it follows (with or without the backward prefetch: :func:`_solved`); ``enable``
        before ``fully_shard``. None: a sharded model whose layout differs is an error.
    units : StageUnits, optional
        The blocks cut into sub-blocks: the module whose unit holds each of their stages.
    """

    def __init__(
        self,
        planned: Any,
        modules: Sequence[nn.Module | None],
        layout: ShardLayout,
        replan: Callable[[ShardLayout], ShardLayout] | None = None,
        units: StageUnits | None = None,
    ) -> None:
        self.planned = planned
        self.model: nn.Module = planned.model
        self.modules = list(modules)
        self.layout = layout
        self.replan = replan
        self.units = units or StageUnits({}, {})
        self.blocks: dict[int, _Block] = {}  # a unit's first stage -> the unit, once sharded
        self.starts: dict[int, int] = {}  # id() of a unit's module -> its first stage
        self.window = len(self.modules) - 1  # the stage whose backward is next
        self.dropped = False  # the prefetched all-gather of this window was dropped
        self.gathered: set[int] = set()  # the unsharded parameters of the block computing
        self.checked = False
        self._handles: list[Any] = []
        self._prefetches: dict[int, tuple[Any, list[Any]]] = {}  # id(unit) -> its own list
        self.source: tuple[Profile, str | None] | None = None  # the whole model's, the loop's
        planned.sharding = self

    def plan_for(
        self, profile: Profile, loop: TrainingLoop, solve: Callable[[Profile], Schedule]
    ) -> tuple[Profile, Schedule]:
        """One rank's profile of the whole model's ``profile`` in the layout the plan follows,
        for ``loop``, and its plan by ``solve``, agreed by every rank (rank 0's): the re-solve of
        a loop seen (NOTE [ the loop seen ] in :mod:`memplan.torch.runtime.loop_watch`).
        """
        self.source = (profile, loop.gradients)
        self.layout, sharded, schedule = _solved(
            profile, replace(self.layout, prefetch=True), loop.gradients, solve
        )
        if self.checked:
            self._set_prefetch()
        return sharded, schedule

    def rank_profile(self, prefetch: bool) -> Profile:
        """One rank's profile in the plan's layout, with FSDP2's backward prefetch or without
        (NOTE [ Without the backward prefetch ] in :mod:`memplan.profile.sharding`): the least
        memory ``enable`` plans for is that of the profile without it.
        """
        if self.source is None:
            raise RuntimeError("memplan: the plan was installed without its profile")
        profile, gradients = self.source
        return shard_profile(profile, replace(self.layout, prefetch=prefetch), gradients)

    # -- the step ------------------------------------------------------------------------------
    def before_step(self) -> None:
        """At the first step: the model's layout is the plan's, or the plan is made again."""
        self.window, self.dropped = len(self.modules) - 1, False
        if self.checked:
            return
        ranks = sharded_over(self.model)
        if ranks is not None and self.planned.schedule.budget.gradients == "step-in-backward":
            raise InputError(
                f"{type(self.model).__name__} is sharded with fully_shard: a plan with "
                "gradients='step-in-backward' steps whole parameters in the backward, which "
                "FSDP2 reduce-scatters after it; enable it with the loop's gradients (the default)"
            )
        holders = self.units.holders(self.modules)
        if ranks is not None:
            self._check_parts()
        blocks = set() if ranks is None else fsdp_blocks(self.model, holders)
        copies = 0 if ranks is None else collective_copies()
        spans = {k: first for k, first in self.units.spans.items() if k in blocks}
        found = model_layout(
            self.modules, ranks or 1, blocks, copies, self.layout.loss_in_root, spans
        )
        same = replace(found, prefetch=self.layout.prefetch) == self.layout
        if not same and (ranks is not None or self.layout.shards > 1):
            if self.replan is None:
                raise RuntimeError(
                    f"memplan: the model is sharded over {ranks or 1} rank(s), the plan was made "
                    f"for {self.layout.shards}: enable it again"
                )
            self.layout = self.replan(found)
        self.checked = True
        self._set_prefetch()
        for k in sorted(blocks):
            first = spans.get(k, k)
            if first != k:
                continue
            last = max(j for j in blocks if spans.get(j, j) == first)
            block = _stage_module(holders[k])
            assert block is not None
            self.blocks[k] = _Block(block)
            self.starts[id(block)] = k
            # appended: after FSDP2's post-forward hook, which hooks the block's output
            self._handles.append(block.register_forward_hook(self._reached(last)))
            # prepended: before FSDP2's pre-forward hook, which all-gathers the block
            self._handles.append(block.register_forward_pre_hook(self._drop(k), prepend=True))
            self._handles.append(block.register_forward_pre_hook(self._gathering(k)))

    def _check_parts(self) -> None:
        """A block cut into sub-blocks is one FSDP2 unit (or part of the root), with no unit
        inside it: its parts would gather and reshard apart, which the terms do not count (NOTE
        [ A unit spanning stages ] in :mod:`memplan.profile.sharding`).
        """
        for block in self.units.cut_blocks():
            if any(m is not block and is_sharded(m) for m in block.modules()):
                raise InputError(
                    f"{_class_name(self.model)}: a block cut into sub-blocks "
                    f"({_class_name(block)}) has fully_shard units inside it; memplan plans a "
                    "cut block as one unit spanning its sub-blocks: call fully_shard on each "
                    "whole block (and on the root), or enable without sub_blocks"
                )

    def _reached(self, k: int) -> Callable[..., Any]:
        """A block's forward hook: the next stage reads a view of its output, whose node runs
        the plan up to ``B k`` before FSDP2's pre-backward hook of the block.
        """

        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            self.gathered = set()  # resharded, or kept by FSDP2: no saved tensor of another
            out = primary_output(output)  # stage holds them (their addresses may be reused)
            if out is None or not out.requires_grad or _in_backward():
                return None
            if not isinstance(output, (Tensor, tuple, list)):
                return None  # a mapping: left as it is (memplan recomputes after FSDP2's hook)
            view = out.view_as(out)
            assert view.grad_fn is not None
            view.grad_fn.register_prehook(lambda grads: self._reach(k))
            return with_primary(output, view)

        return hook

    def _reach(self, k: int) -> None:
        self.window, self.dropped = k, False
        iteration = self.planned.iteration
        if iteration is not None:
            iteration.reach_backward(k)

    def _next(self) -> int | None:
        """The unit whose backward runs next (the last while the root's stages after it run), by
        its first stage.
        """
        nearest = [k for k in self.blocks if k <= self.window]
        return max(nearest) if nearest else None

    def _drop(self, k: int) -> Callable[..., None]:
        """A block's pre-forward hook: drop FSDP2's prefetch before recomputing another block.

        Before memplan recomputes a block other than the next to run backward, the all-gather
        FSDP2's backward prefetch made for that one is copied out and resharded, once per window
        (NOTE [ FSDP2 memory terms ]: a window holds no prefetched output).
        """

        def hook(module: nn.Module, args: Any) -> None:
            if not _in_backward() or self.dropped or not self.layout.prefetch:
                return
            following = self._next()
            if following is None or following == k:
                return
            self.dropped = True
            block = self.blocks[following]
            if not block.gathered():
                block.module.unshard()
                block.module.reshard()

        return hook

    def _gathering(self, k: int) -> Callable[..., None]:
        """A block's pre-forward hook, after FSDP2's: its unsharded parameters' storages."""

        def hook(module: nn.Module, args: Any) -> None:
            self.gathered = self.blocks[k].pointers()

        return hook

    def static(self, pointers: StaticStorages) -> Container[int]:
        """The storages the plan treats as parameters: ``pointers`` and the unsharded
        parameters of the block computing (its saved tensors are the only ones holding them).

        ``pointers`` are taken at the step's first saved tensor, maybe while a block computes:
        the unsharded parameters of the blocks gathered then are not among them (FSDP2 frees
        them at the block's reshard and the allocator reuses their addresses for activations,
        which would be taken for parameters); :meth:`_gathering` names them while they compute.
        """
        if not self.blocks:
            return pointers
        gathered = set().union(*(block.pointers() for block in self.blocks.values()))
        return _WithGathered(pointers.without(gathered), self)

    @contextmanager
    def replaying(self, module: nn.Module) -> Iterator[None]:
        """Around a recomputation of a part of ``module``, a block cut into sub-blocks, replayed
        from its operations (no call of the block, so no FSDP2 hook): gather the block as its
        pre-forward hook would, after dropping the prefetch of another block as :meth:`_drop`
        does; :meth:`recomputing` reshards it after, unless its backward runs next. A part
        recomputed inside its block's backward finds it gathered by FSDP2 (NOTE [ A unit
        spanning stages ] in :mod:`memplan.profile.sharding`).
        """
        first = self.starts.get(id(module))
        if first is None:
            yield
            return
        block = self.blocks[first]
        if not block.gathered():
            self._drop(first)(module, ())
            block.module.unshard()
        self.gathered = block.pointers()
        try:
            yield
        finally:
            self.gathered = set()

    @contextmanager
    def recomputing(self) -> Iterator[None]:
        """Around a recomputation: reshard the blocks it gathered, but the next to run backward."""
        if not self.blocks or not _in_backward():
            yield
            return
        before = {k: block.gathered() for k, block in self.blocks.items()}
        try:
            yield
        finally:  # a recomputation that stopped early did not reach :meth:`_reached`, which
            self.gathered = set()  # forgets the gathered parameters' addresses
            keep = self._next()
            for k, block in self.blocks.items():
                if not before[k] and k != keep and block.gathered():
                    block.module.reshard()

    def _set_prefetch(self) -> None:
        """FSDP2's backward prefetch on the model's units as the plan's layout has it.

        Without it (NOTE [ Without the backward prefetch ] in :mod:`memplan.profile.sharding`):
        each unit is told to prefetch itself alone (``set_modules_to_backward_prefetch``; torch
        2.13 takes an empty list for the implicit prefetch), its own list kept for
        :meth:`_restore_prefetch`; with it, the units' own lists.
        """
        if self.layout.prefetch:
            self._restore_prefetch()
            return
        for unit in self.model.modules():
            if not is_sharded(unit):
                continue
            state: Any = unit._get_fsdp_state()
            if id(unit) not in self._prefetches:
                self._prefetches[id(unit)] = (state, list(state._states_to_backward_prefetch))
            unit.set_modules_to_backward_prefetch([unit])

    def _restore_prefetch(self) -> None:
        """Give the units back the backward prefetch lists they had before the plan."""
        for state, own in self._prefetches.values():
            state._states_to_backward_prefetch = own
        self._prefetches = {}

    def remove(self) -> None:
        """Remove the hooks (``disable``) and give the units back their backward prefetch."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._restore_prefetch()
        self.blocks = {}
        self.starts = {}
        self.checked = False


class _WithGathered:
    """The static storages and those of the unsharded parameters of the block computing (FSDP2
    allocates them anew at each all-gather: :meth:`ShardedSteps._gathering`).
    """

    def __init__(self, pointers: StaticStorages, steps: ShardedSteps) -> None:
        self.pointers = pointers
        self.steps = steps

    def __contains__(self, ptr: object) -> bool:
        return ptr in self.pointers or ptr in self.steps.gathered


# ------------------------------------------------------------------------------------------------
# enable under FSDP2
# ------------------------------------------------------------------------------------------------


def shard_count(model: nn.Module, shards: int | None) -> int | None:
    """The ranks ``enable`` was told to plan one of (None: not told; :func:`install_sharded`).

    Raises
    ------
    InputError
        ``shards`` not a positive count, or a model sharded already: ``enable`` profiles and cuts
        the whole model (its stages run alone, outside FSDP2's root), so it comes before
        ``fully_shard``.
    """
    given = check_shards(shards)
    if sharded_over(model) is not None:
        raise InputError(
            f"enable: {type(model).__name__} is sharded with fully_shard already; memplan "
            "profiles and cuts the whole model: call memplan.torch.enable before fully_shard "
            "(the first sharded step plans for the ranks of the model's mesh)"
        )
    return given


def _world_size() -> int:
    """The default process group's size (1 without one)."""
    import torch.distributed as dist

    return int(dist.get_world_size()) if dist.is_available() and dist.is_initialized() else 1


@dataclass(frozen=True)
class StageUnits:
    """The stages of blocks cut into sub-blocks and the blocks that hold them.

    ``holder``: stage -> the block whose FSDP2 unit holds the stage (its module is a part);
    ``spans``: stage -> the first stage of its block (NOTE [ A unit spanning stages ] in
    :mod:`memplan.profile.sharding`).
    """

    holder: dict[int, nn.Module]
    spans: dict[int, int]

    def holders(self, modules: Sequence[nn.Module | None]) -> list[nn.Module | None]:
        """Each stage's module, or the block whose unit holds it."""
        return [self.holder.get(k, module) for k, module in enumerate(modules)]

    def cut_blocks(self) -> list[nn.Module]:
        """The blocks cut into sub-blocks."""
        return list({id(m): m for m in self.holder.values()}.values())


def _stage_modules(target: Target) -> tuple[list[nn.Module | None], set[int], StageUnits]:
    """The module of each stage of a prepared model (None: the loss), the stages ``fully_shard``
    makes units in FSDP2's recipe: the blocks (NOTE [ FSDP2 memory terms ]), and the blocks cut
    into sub-blocks, a unit each.
    """
    modules: list[nn.Module | None] = list(stage_modules(target))
    units = StageUnits({}, {})
    if target.how == "hooks":
        found = target.layout
        first = 1 if found.prefix else 0
        count = sum(found.block_stages(i) for i in range(len(found.block_modules)))
        blocks = set(range(first, first + count))
        start = first
        for i, block in enumerate(found.block_modules):
            stages = found.block_stages(i)
            if stages > 1:
                for k in range(start, start + stages):
                    units.holder[k], units.spans[k] = block, start
            start += stages
        if target.chunked is not None:  # the head and the loss: one stage, the chunked loss
            return [*modules[:-1], target.chunked], blocks, units
    else:
        blocks = set(range(1, len(modules) - 1)) if len(modules) >= 3 else set()
    return [*modules, None], blocks, units


def install_sharded(
    target: Target,
    profile: Profile,
    ranks: int | None,
    loop: TrainingLoop,
    solve: Callable[[Profile, TrainingLoop], Schedule],
    loss_in_model: bool = False,
    without_prefetch: bool = True,
) -> nn.Module:
    """Plan one of ``ranks`` ranks of the prepared model from the whole model's ``profile``
    for the training loop ``loop`` with ``solve``, install the plan, and follow FSDP2
    (:class:`ShardedSteps`).

    ``ranks`` None: one (the whole model), or, when no plan of the whole model fits and a default
    process group has N > 1 ranks, one of N as FSDP2 would shard it. The layout is FSDP2's
    recipe's (:func:`_stage_modules`; with one rank the profile is the model's own); the first
    step checks it against the model (sharded or not, a DDP model for one) and plans again when
    they differ, for the loop the plan then counts. ``loss_in_model``: the model computes its
    loss (an HF batch with labels). ``without_prefetch``: where no plan with FSDP2's backward
    prefetch fits, plan without it (:func:`_solved`); False where the caller has another way
    to try first (``sub_blocks="auto"``: the blocks cut, with the prefetch).

    Raises
    ------
    InputError
        No plan fits (the least memory that fits is in the message).
    """
    modules, expected, units = _stage_modules(target)
    model = target.model
    refusal = _shard_refusal(target)
    if refusal is not None and (ranks or 1) > 1:
        raise InputError(refusal)

    def plan_for(count: int) -> tuple[ShardLayout, Profile, Schedule]:
        found = model_layout(
            modules, count, expected, collective_copies(), loss_in_model, units.spans
        )
        return _solved(profile, found, loop.gradients, lambda p: solve(p, loop), without_prefetch)

    try:
        layout, rank_profile, schedule = plan_for(ranks or 1)
    except InputError:
        if ranks is not None or _world_size() == 1:
            raise
        layout, rank_profile, schedule = plan_for(_world_size())  # then fully_shard, or not
    install(target, schedule, rank_profile)
    plan = planned(model)
    assert plan is not None

    def replan(found: ShardLayout) -> ShardLayout:
        now = plan.schedule.budget.loop  # the loop the installed plan counts
        chosen, again, schedule = _solved(profile, found, now.gradients, lambda p: solve(p, now))
        check_schedule(schedule, plan.names, again)
        steps.source = (profile, now.gradients)
        plan.schedule, plan.profile = schedule, again
        plan.plan = RuntimePlan(schedule, len(plan.names), plan.plan.input_transfers)
        return chosen

    steps = ShardedSteps(plan, modules, layout, replan, units)
    steps.source = (profile, loop.gradients)
    return model


def _shard_refusal(target: Target) -> str | None:
    """Why a model whose blocks are call groups of parallel module
    lists (NOTE [ Parallel lists as blocks ]) or one block called for several stages, cannot
    train sharded (None: none of these).
    """
    modules = target.layout.block_modules if target.how == "hooks" else []
    if len({id(m) for m in modules}) < len(modules):
        return (
            f"enable: {type(target.model).__name__} calls one block for several stages (its "
            "weights shared), and FSDP2's recipe makes a fully_shard unit of each block "
            "module: give the model a memplan_stages() method whose stages are the units "
            "(docs/sharding.md)"
        )
    if target.how == "hooks" and target.layout.groups:
        return (
            f"enable: {type(target.model).__name__}'s blocks are call groups of parallel "
            "module lists (no module computes a block), and FSDP2's recipe makes a fully_shard "
            "unit of each block module: give the model a memplan_stages() method whose stages "
            "are the units (docs/sharding.md)"
        )
    return None


def _solved(
    profile: Profile,
    layout: ShardLayout,
    gradients: str | None,
    solve: Callable[[Profile], Schedule],
    without_prefetch: bool = True,
) -> tuple[ShardLayout, Profile, Schedule]:
    """The layout, one rank's profile and its plan, agreed by every rank (:func:`_agreed`):
    with FSDP2's backward prefetch, or, where no plan with it fits, without it (unless
    ``without_prefetch`` is False).

    Without the prefetch a unit's all-gather is not hidden behind the backward of the unit
    after it on a GPU, a latency the profile's times do not count (NOTE [ Without the backward
    prefetch ] in :mod:`memplan.profile.sharding`): a last resort before no plan at all.

    Raises
    ------
    InputError
        No plan fits without the prefetch either (its least memory in the message).
    """
    try:
        sharded = shard_profile(profile, layout, gradients)
        return (layout, *_agreed(sharded, solve, layout.shards))
    except InputError:
        if layout.shards == 1 or not layout.blocks or not (layout.prefetch and without_prefetch):
            raise
    without = replace(layout, prefetch=False)
    sharded = shard_profile(profile, without, gradients)
    return (without, *_agreed(sharded, solve, without.shards))


def _agreed(
    profile: Profile, solve: Callable[[Profile], Schedule], ranks: int
) -> tuple[Profile, Schedule]:
    """The profile and plan of rank 0, on every rank of the default process group.

    Ranks profile their own copies, so their times differ, and so may their plans; the ranks of
    a sharded model must recompute the same blocks (each recomputation all-gathers), so they
    follow rank 0's plan. With one rank, or no process group: ``profile`` and its plan.
    """
    import torch.distributed as dist

    if ranks == 1 or not (dist.is_available() and dist.is_initialized()):
        return profile, solve(profile)
    sent: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            sent = [(profile.to_dict(), solve(profile).to_json())]
        except InputError as exc:
            sent = [str(exc)]
    device = torch.device("cuda", torch.cuda.current_device()) if _nccl() else None
    dist.broadcast_object_list(sent, src=0, device=device)
    if isinstance(sent[0], str):
        raise InputError(sent[0])
    made, plan = sent[0]
    return Profile.model_validate(made), load_schedule(json.loads(plan))


def _nccl() -> bool:
    import torch.distributed as dist

    return bool(dist.get_backend() == "nccl")
