"""Watch the user's training loop around a model under a plan, and re-plan when it differs.

NOTE [ the loop seen ]
----------------------
A plan counts what the user's loop holds besides the activations (docs/model.md, "The training
loop"): the optimizer's state and its step's temporaries, the gradients between steps, the model's
output the caller keeps. :func:`memplan.torch.enable` cannot know them before the loop runs, so it
plans for the most any of them needs (what it is told excepted: ``optimizer="adamw"``,
``gradients="kept"``) and :class:`LoopWatch` looks, at three points of every step:

* **the start of a step** (a forward pre-hook on the model, before the plan's iteration starts):
  whether a parameter has a gradient already (``zero_grad(set_to_none=False)``, gradient
  accumulation: the loop keeps them, ``kept``) or none (PyTorch's default, ``at-backward``);
  whether the previous step's output is still alive (the caller holds it from step to step);
* **the end of the forward** (a forward hook): the output the caller receives (a weak reference:
  memplan holds nothing of it);
* **the optimizer's step** (PyTorch's global optimizer-step hook, for an optimizer of the model's
  parameters): which optimizer steps and how (:func:`~memplan.torch.base.optimizers.describe_optimizer`),
  and whether the output is still alive then.

What it has seen is kept for the next steps (an optimizer seen, gradients seen kept, an output
seen held: a loop that does so once may do so again, and a plan that changes at every step
would cost a solve each time). At the start of a step, when the loop seen differs from the one
the plan counts, :class:`LoopWatch` asks for a new plan (``replan``, which solves on the same
profile and budget) and installs it before anything of the step is allocated. A budget that
cannot hold the loop seen is an :class:`~memplan.InputError` then, naming what it saw.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from memplan.loop import Gradients, Optimizer, TrainingLoop
from memplan.schedule import Schedule
from memplan.torch.base.optimizers import describe_optimizer
from memplan.torch.base.storage import distinct_bytes, tensors_of
from memplan.torch.runtime.checkpointed import CheckpointedChain
from memplan.torch.runtime.plan import RuntimePlan
from memplan.torch.runtime.planned_model import PlannedModel
from memplan.torch.runtime.step_in_backward import INTERNAL

__all__ = ["LoopWatch", "Watched"]


_MEMORY_SETTINGS = ("foreach", "fused", "weight_decay", "momentum", "nesterov", "amsgrad")
"""A parameter group's settings that change what its step holds (the learning rate does not)."""


def _memory_settings(group: dict[str, Any]) -> tuple[Any, ...]:
    """What of a parameter group decides its step's memory: those settings and its size."""
    values = tuple(
        float(v) if isinstance(v, Tensor) else v for v in map(group.get, _MEMORY_SETTINGS)
    )
    return (len(group["params"]), *values)


def _weakly(method: Callable[..., None]) -> Callable[..., None]:
    """``method``, holding its object weakly (nothing once the object is gone)."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        found = ref()
        if found is not None:
            found(*args)

    return call


Watched = tuple[bool, bool, bool]
"""Which parts of the loop are watched: ``(optimizer, gradients, output)``."""
Groups = list[list[nn.Parameter]]
"""An optimizer's parameter groups (the model's parameters among them), in its order."""


class LoopWatch:
    """The hooks of NOTE [ the loop seen ] on a model under a plan.

    Parameters
    ----------
    planned : PlannedModel or CheckpointedChain
        The plan installed on a model (:func:`memplan.torch.enable`), or a wrapped chain
        (:func:`memplan.torch.fit`): its ``schedule`` and ``plan`` are replaced by the new plans,
        its forward is a step's start. The hooks are removed with it (:meth:`remove`).
    replan : callable
        ``replan(loop, groups) -> (Schedule, Profile)``: a feasible plan for ``loop`` on the same
        profile and budget, the optimizer's parameter groups (its order: the profile's
        ``parameter_sizes``) when one was seen, and the profile it was made on (raises
        :class:`~memplan.InputError` when there is none).
    watched : (bool, bool, bool)
        Whether the optimizer, the gradients and the output are watched (a part given by the
        caller is not).
    """

    def __init__(
        self,
        planned: PlannedModel | CheckpointedChain,
        replan: Callable[[TrainingLoop, Groups | None], tuple[Schedule, Any]],
        watched: Watched,
    ) -> None:
        self.planned = planned
        self.replan = replan
        self.watch_optimizer, self.watch_gradients, self.watch_output = watched
        model = planned.model if isinstance(planned, PlannedModel) else planned
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ids = {id(p) for p in self.params}
        self.optimizer: Optimizer | None = None
        self.groups: Groups | None = None  # the parameter groups of the optimizer seen
        self.planned_groups: Groups | None = None
        self.last: torch.optim.Optimizer | None = None  # the last optimizer stepped, as seen
        self.last_seen: Any = None
        self.mine: Groups = []
        self.described: Optimizer | None = None
        self.kept = False
        self.held = False
        self.held_bytes = 0  # the most the caller was seen holding of an output
        self.whole_step = False  # a step seen to its end (its optimizer step, or the next one)
        self.output: list[weakref.ref[Tensor]] | None = None  # the last output's tensors
        self.replans = 0
        # PyTorch keeps its global optimizer hooks for ever: this one holds the watch weakly,
        # and goes with it, so that a model under a plan can be collected as any other
        steps = register_optimizer_step_pre_hook(_weakly(self._optimizer_steps))
        weakref.finalize(self, steps.remove)
        self.handles = [
            model.register_forward_pre_hook(self._step_starts, prepend=True),
            model.register_forward_hook(self._forward_ends),
            steps,
        ]
        if isinstance(planned, PlannedModel):
            planned._handles.append(self)  # removed with the plan (disable)

    def remove(self) -> None:
        """Remove the hooks: the plan stays as it is."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    @property
    def loop(self) -> TrainingLoop:
        """The loop the installed plan counts."""
        return self.planned.schedule.budget.loop

    def seen(self) -> TrainingLoop:
        """The loop to plan for now: what was seen, and the plan's own for what was not."""
        planned = self.loop
        optimizer = planned.optimizer
        if self.watch_optimizer and self.optimizer is not None:
            optimizer = self.optimizer
        gradients: Gradients | None = planned.gradients
        if self.watch_gradients and planned.gradients in ("at-backward", "kept"):
            gradients = "kept" if self.kept else "at-backward"
        held, held_bytes = planned.output_held, planned.output_bytes
        if self.watch_output and self.whole_step:
            held, held_bytes = self.held, (self.held_bytes if self.held else None)
        return TrainingLoop(optimizer, gradients, held, held_bytes)

    # -- the hooks ---------------------------------------------------------------------------
    def _training(self) -> bool:
        recomputing = getattr(self.planned, "_recomputing", 0)  # a PlannedModel's recomputation
        return torch.is_grad_enabled() and not recomputing

    def _step_starts(self, module: nn.Module, args: Any) -> None:
        if not self._training():
            return
        self._refresh_parameters()
        if self.watch_gradients and any(p.grad is not None for p in self.params):
            self.kept = True
        if self.output is not None:  # the step before has ended
            self.whole_step = True
            self._look_at_output()
        wanted = self.seen()
        if wanted != self.loop or self.groups is not self.planned_groups:
            schedule, profile = self.replan(wanted, self.groups)
            self.planned_groups = self.groups
            self._install(schedule, profile)

    def _refresh_parameters(self) -> None:
        """The model's parameters, again when they were replaced (``fully_shard`` after
        ``enable`` makes them sharded parameters): the optimizer seen steps those.
        """
        current = [p for p in self.model.parameters() if p.requires_grad]
        if len(current) == len(self.params) and all(
            p is q for p, q in zip(current, self.params, strict=True)
        ):
            return
        self.params = current
        self.ids = {id(p) for p in current}
        self.last = None  # read the optimizer's groups again at its next step

    def _forward_ends(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._training():
            return
        self.output = [weakref.ref(t) for t in tensors_of(output)]

    def _optimizer_steps(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if getattr(optimizer, INTERNAL, False):
            return  # a parameter stepped in the backward (the user's step comes after)
        settings = [_memory_settings(g) for g in optimizer.param_groups]
        if optimizer is not self.last or settings != self.last_seen:
            # a new optimizer, or new groups or settings that change its memory
            mine = [[p for p in g["params"] if id(p) in self.ids] for g in optimizer.param_groups]
            mine = [group for group in mine if group]
            if not mine:  # another model's optimizer (a GAN's other one, a benchmark's): the
                return  # one seen stays, so that its next step is not taken for a new one
            self.last, self.last_seen = optimizer, settings
            self.mine = mine
            self.described = describe_optimizer(optimizer)
        if self.watch_optimizer:
            self.optimizer = self.described
        self.groups = self.mine
        self.whole_step = True
        self._look_at_output()

    def _look_at_output(self) -> None:
        alive = [t for t in (ref() for ref in self.output or ()) if t is not None]
        if alive:  # the caller holds (some of) the model's output after its backward
            self.held = True
            self.held_bytes = max(self.held_bytes, distinct_bytes(alive))

    def _install(self, schedule: Schedule, profile: Any) -> None:
        planned = self.planned
        planned.schedule = schedule
        planned.plan = RuntimePlan(  # the next step follows it
            schedule, len(planned.names), planned.plan.input_transfers
        )
        if isinstance(planned, PlannedModel):
            planned.profile = profile
        self.replans += 1
