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
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from memplan.loop import Gradients, Optimizer, TrainingLoop
from memplan.schedule import Schedule
from memplan.torch.base.optimizers import describe_optimizer
from memplan.torch.runtime.plan import RuntimePlan
from memplan.torch.runtime.planned_model import PlannedModel
from memplan.torch.runtime.step_in_backward import INTERNAL
from memplan.torch.split.trace import model_output

__all__ = ["LoopWatch", "Watched"]

Watched = tuple[bool, bool, bool]
"""Which parts of the loop are watched: ``(optimizer, gradients, output)``."""


class LoopWatch:
    """The hooks of NOTE [ the loop seen ] on a model under a plan.

    Parameters
    ----------
    planned : PlannedModel
        The plan installed on the model; its schedule is replaced by the new plans.
    replan : callable
        ``replan(loop) -> Schedule``: a feasible plan for ``loop`` on the same profile and
        budget (raises :class:`~memplan.InputError` when there is none).
    watched : (bool, bool, bool)
        Whether the optimizer, the gradients and the output are watched (a part given by the
        caller is not).
    """

    def __init__(
        self,
        planned: PlannedModel,
        replan: Callable[[TrainingLoop], Schedule],
        watched: Watched,
    ) -> None:
        self.planned = planned
        self.replan = replan
        self.watch_optimizer, self.watch_gradients, self.watch_output = watched
        self.params = [p for p in planned.model.parameters() if p.requires_grad]
        self.ids = {id(p) for p in self.params}
        self.optimizer: Optimizer | None = None
        self.kept = False
        self.held = False
        self.whole_step = False  # a step seen to its end (its optimizer step, or the next one)
        self.output: weakref.ref[Any] | None = None
        self.replans = 0
        model = planned.model
        add = planned._handles.append  # removed with the plan (disable)
        add(model.register_forward_pre_hook(self._step_starts, prepend=True))
        add(model.register_forward_hook(self._forward_ends))
        add(register_optimizer_step_pre_hook(self._optimizer_steps))

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
        held = planned.output_held
        if self.watch_output and self.whole_step:
            held = self.held
        return TrainingLoop(optimizer, gradients, held)

    # -- the hooks ---------------------------------------------------------------------------
    def _training(self) -> bool:
        return torch.is_grad_enabled() and not self.planned._recomputing

    def _step_starts(self, module: nn.Module, args: Any) -> None:
        if not self._training():
            return
        if self.watch_gradients and any(p.grad is not None for p in self.params):
            self.kept = True
        if self.output is not None:  # the step before has ended
            self.whole_step = True
            self._look_at_output()
        wanted = self.seen()
        if wanted != self.loop:
            self._install(self.replan(wanted))

    def _forward_ends(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._training():
            return
        out = model_output(output)
        self.output = None if out is None else weakref.ref(out)

    def _optimizer_steps(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if getattr(optimizer, INTERNAL, False):
            return  # a parameter stepped in the backward (the user's step comes after)
        if not any(id(p) in self.ids for g in optimizer.param_groups for p in g["params"]):
            return  # another model's optimizer
        if self.watch_optimizer:
            self.optimizer = describe_optimizer(optimizer)
        self.whole_step = True
        self._look_at_output()

    def _look_at_output(self) -> None:
        if self.output is not None and self.output() is not None:
            self.held = True  # the caller holds the model's output after its backward

    def _install(self, schedule: Schedule) -> None:
        planned = self.planned
        planned.schedule = schedule
        planned.plan = RuntimePlan(schedule, len(planned.names))
        self.replans += 1
