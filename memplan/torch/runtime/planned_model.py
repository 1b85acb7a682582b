"""A plan installed on a model: :class:`PlannedModel`, what :func:`memplan.torch.planned` returns.

How the plan follows the model's forward: NOTE [ Following the model's own forward ] in
:mod:`memplan.torch.runtime.planned`.
"""

import warnings
from collections.abc import Callable, Container
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.schedule import Schedule
from memplan.torch.runtime.iteration import PassiveIteration, PlannedIteration, static_pointers
from memplan.torch.runtime.plan import RuntimeCounters, RuntimePlan, planned_forward_counts
from memplan.torch.runtime.slots import autocast_state

PLAN_ATTRIBUTE = "_memplan_plan"


class PlannedModel:
    """A plan installed on a model (:func:`enable`); ``planned(model)`` returns it.

    Attributes
    ----------
    schedule : Schedule
        The plan.
    profile : Profile
        The profile it was made from (``batch_size``, ``input_shape``: the largest batch it
        serves).
    names : list of str
        The chain's stages, the loss last.
    counters : RuntimeCounters
        What the last training step did (forward computations per stage; the bytes held when
        ``tally``).
    tally : bool
        Count the bytes the plan holds too (``saved_bytes``, ``live_bytes``,
        ``peak_live_bytes``, ``live_curve``): off by default, it looks at every tensor autograd
        saves, which costs time the plan does not need (NOTE [ What the runtime skips ] in
        :mod:`memplan.torch.runtime.iteration`).
    how : str
        ``hooks`` or ``stages`` (NOTE [ Following the model's own forward ]).
    """

    def __init__(
        self,
        model: nn.Module,
        schedule: Schedule,
        profile: Any,
        names: list[str],
        inplace: list[bool],
    ) -> None:
        self.model = model
        self.schedule = schedule
        self.profile = profile
        self.names = names
        # the caller holds the input: the plan's transfers of x[0] would free nothing
        self.plan = RuntimePlan(schedule, len(names), input_transfers=False)
        self.inplace = inplace
        self.counters = RuntimeCounters()
        self.how = "stages"
        self.tally = False
        self._modules = list(model.modules())  # whose parameters and buffers are never s[k]
        self.loss_virtual = True  # the loss is the model's or the caller's, not a stage run here
        self._handles: list[Any] = []
        self._streams: dict[Any, Any] = {}
        self._recomputing = 0
        self._autocast = autocast_state(_device_of(model))
        measured = getattr(profile, "measured", None)
        recorded = (getattr(measured, "extra", None) or {}).get("autocast")
        self._profiled = recorded or describe_autocast(self._autocast)
        self._warned = False
        self.iteration: PlannedIteration | None = None
        """The step under way (or the last one)."""
        self.chunked: Any = None
        """The chunked head and loss (:class:`memplan.torch.split.chunked_loss.ChunkedLoss`) with
        ``loss_chunks``: its ``tied_into_grad`` and ``tied_returned`` count the backwards that wrote
        a tied gradient into ``.grad`` and those that kept today's way (NOTE [ The tied gradient
        summed in place ] in :mod:`memplan.torch.split.tied_lookup`)."""
        self.sharding: Any = None
        """Under FSDP2, :class:`memplan.torch.runtime.fsdp.ShardedSteps` (NOTE [ Plans under
        FSDP2 ]): checked at each step's start, told about each recomputation."""

    def planned_forward_counts(self) -> list[int]:
        """Forward operations per stage in the plan."""
        return planned_forward_counts(self.schedule, len(self.names))

    def remove(self) -> None:
        """Uninstall the plan: the model trains plainly again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self.sharding is not None:
            self.sharding.remove()
        if "forward" in vars(self.model):
            del self.model.forward
        if getattr(self.model, PLAN_ATTRIBUTE, None) is self:
            delattr(self.model, PLAN_ATTRIBUTE)

    # -- a step ----------------------------------------------------------------------------
    def _check_batch(self, x0: Tensor) -> None:
        prof = self.profile
        planned = (prof.batch_size, *prof.input_shape) if prof.batch_size else None
        if planned is None:
            return
        shape = tuple(x0.shape)
        if len(shape) != len(planned) or any(a > b for a, b in zip(shape, planned, strict=True)):
            raise InputError(
                f"batch of shape {list(shape)}: the plan was made for {list(planned)} "
                f"({prof.model}), and a larger batch or sequence needs more memory than planned; "
                "call memplan.torch.enable(model, ..., example_input=<the largest batch>) again"
            )
        now = describe_autocast(autocast_state(x0.device))
        if now != self._profiled and not self._warned:
            self._warned = True
            warnings.warn(
                f"memplan: the plan was profiled with autocast {self._profiled} and this step "
                f"runs with {now}: the sizes differ from the plan's; call "
                "memplan.torch.enable inside the same torch.autocast context as the training",
                stacklevel=4,
            )

    def passive(self) -> bool:
        """Whether a step runs the model untouched (a plan that keeps what plain training
        keeps, no tally, the loss not a stage run here): no stage needs marking.
        """
        return self.plan.passive and not self.tally and self.loss_virtual

    def _iteration(self, x0: Tensor) -> PlannedIteration | PassiveIteration:
        self._check_batch(x0)
        if self.sharding is not None:
            self.sharding.before_step()  # may plan again (the model sharded since enable)
        self.counters = RuntimeCounters.for_stages(len(self.names))
        if self.passive():
            self.iteration = None
            return PassiveIteration(self.plan, self.counters)
        self.iteration = PlannedIteration(
            self.plan, x0, self._static, self.counters, self._streams,
            virtual={len(self.names) - 1} if self.loss_virtual else set(),
            tally=self.tally, inplace=self.inplace,
            names=self.names,
        )  # fmt: skip
        return self.iteration

    def _static(self) -> Container[int]:
        pointers = static_pointers(self._modules)
        if self.sharding is not None:  # FSDP2's unsharded parameters too
            return self.sharding.static(pointers)  # type: ignore[no-any-return]
        return pointers

    def _recompute(self, function: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        """A stage function that the hooks let through (a recomputation is not a step)."""

        def run(x: Tensor) -> Tensor:
            self._recomputing += 1
            try:
                if self.sharding is None:
                    return function(x)
                with self.sharding.recomputing():
                    return function(x)
            finally:
                self._recomputing -= 1

        return run


def describe_autocast(state: list[tuple[str, bool, torch.dtype, bool]]) -> str:
    on = [
        f"{kind}:{str(dtype).removeprefix('torch.')}"
        for kind, enabled, dtype, _ in state
        if enabled
    ]
    return ", ".join(on) if on else "off"


def _device_of(model: nn.Module) -> torch.device:
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")
