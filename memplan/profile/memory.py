"""What a chain profile says about memory in the user's training loop: the terms of docs/model.md.

NOTE [ training-loop memory terms ]
A chain schedule is planned and replayed under one of two models, recorded in the schedule's
``budget.gradients``:

* ``at-backward`` (PyTorch's default loop, ``zero_grad(set_to_none=True)``): the static memory is
  the weights and the optimizer state; the parameter gradients of stage ``k``
  (``weight_grad_size[k]``, the stage's ``weight_size`` when the profile lacks it) appear when
  ``B k`` starts and stay to the optimizer's step; ``B k``'s temporaries are
  ``backward_overhead_fresh[k]`` (``backward_overhead`` when the profile lacks it);
* ``kept`` (a loop that keeps its gradient buffers: ``zero_grad(set_to_none=False)``, gradient
  accumulation): the gradients are static memory for the whole step, ``B k``'s temporaries are
  ``backward_overhead[k]``.

Under both, what the profile measured of autograd applies: ``F_all k`` adds
``forward_overhead_all[k]`` (``forward_overhead`` when the profile lacks it), and ``F_all k``
frees ``x[k]`` (as ``s[k-1]``'s part, or the standalone checkpoint) when neither stage ``k-1``
keeps its output (``output_saved``) nor stage ``k`` its input (``input_saved``): a language
model's logits after the loss's forward. ``B k`` then does not need ``x[k]``.

A schedule without ``budget.gradients`` (written before these terms existed, and every offloading,
combined and join schedule) is planned and replayed in the model before them: gradients static,
``forward_overhead`` for every forward, no frees.

Shared by the solvers (:mod:`memplan.algorithms.chain.problem`) and the simulator
(:mod:`memplan.simulator.chain_memory`): it says what the profile's fields mean, not how a plan is
made or checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from memplan.errors import InputError
from memplan.profile.model import Profile, Stage
from memplan.schedule import OPTIMIZER_FACTORS, OptimizerName

Gradients = Literal["at-backward", "kept"]
GRADIENTS: tuple[str, ...] = ("at-backward", "kept")
"""The two loops a chain plan can be made for (NOTE [ training-loop memory terms ])."""
AUTO = "auto"


def check_gradients(gradients: str | None) -> str:
    """``auto`` (also None), ``at-backward`` or ``kept``; an input error naming the option."""
    if gradients is None:
        return AUTO
    if gradients not in (AUTO, *GRADIENTS):
        raise InputError(
            f"--gradients {gradients!r}: expected auto, at-backward (zero_grad(set_to_none=True), "
            "PyTorch's default) or kept (zero_grad(set_to_none=False), gradient accumulation)"
        )
    return gradients


def measured(profile: Profile) -> bool:
    """Whether the profile was measured by memplan's profiler with the default loop's fields."""
    stages = (profile.stages or []) if profile.kind == "chain" else []
    return any(st.weight_grad_size is not None for st in stages)


def resolve_gradients(profile: Profile, gradients: str | None) -> Gradients:
    """The model ``auto`` stands for on ``profile``.

    ``at-backward`` on a profile with ``weight_grad_size`` (measured in PyTorch's loop), ``kept``
    on one without (the bundled profiles of the papers and estimates: their figures, and a bound
    that holds for any loop).
    """
    chosen = check_gradients(gradients)
    if chosen == AUTO:
        return "at-backward" if measured(profile) else "kept"
    return chosen  # type: ignore[return-value]


def static_bytes(
    weight_size: int, optimizer: str, gradients: str | None, workspace: int | None = None
) -> int:
    """Static memory of a chain-model schedule.

    The weights, the optimizer state, the gradients when they are kept for the whole step
    (``gradients`` ``kept`` or None) and the math libraries' ``workspace`` (the profile's
    ``workspace_size``: cuBLAS keeps it from the first step on). ``optimizer`` ``none``: a budget
    for the activations alone.
    """
    if optimizer == "none":
        return 0
    # OPTIMIZER_FACTORS counts the gradients among the copies of the weights
    factor = OPTIMIZER_FACTORS[cast(OptimizerName, optimizer)]  # checked by the callers
    copies = factor - (1 if gradients == "at-backward" else 0)
    return copies * weight_size + (workspace or 0)


@dataclass(frozen=True)
class StageTerms:
    """The training loop's terms of each stage ``k`` of a chain, in bytes.

    What ``F_all k`` adds beyond ``s[k]`` (``forward_all``), what ``B k`` adds beyond ``g[k]``
    (``backward``: its temporaries), the parameter gradients ``B k`` creates and keeps
    (``weight_grads``) and the bytes of ``x[k]`` that ``F_all k`` frees (``freed_input``, 0 for
    the chain input).
    """

    forward_all: list[int]
    backward: list[int]
    weight_grads: list[int]
    freed_input: list[int]


def stage_terms(
    stages: Sequence[Stage], gradients: str | None, optimizer: str = "sgd"
) -> StageTerms:
    """The terms of NOTE [ training-loop memory terms ] for ``stages``.

    ``gradients`` None: the model before them (every term as ``forward_overhead`` /
    ``backward_overhead``, nothing created or freed). With ``optimizer`` ``none`` the budget is
    for activations alone: no weight gradients.
    """
    if gradients is None:
        return StageTerms(
            [st.forward_overhead for st in stages],
            [st.backward_overhead for st in stages],
            [0] * len(stages),
            [0] * len(stages),
        )
    fresh = gradients == "at-backward"
    weight_grads = [
        (st.weight_size if st.weight_grad_size is None else st.weight_grad_size)
        if fresh and optimizer != "none"
        else 0
        for st in stages
    ]
    backward = [
        st.backward_overhead_fresh
        if fresh and st.backward_overhead_fresh is not None
        else st.backward_overhead
        for st in stages
    ]
    forward_all = [
        st.forward_overhead if st.forward_overhead_all is None else st.forward_overhead_all
        for st in stages
    ]
    freed = [0] + [
        stages[k - 1].output_size
        if stages[k - 1].output_saved is False and stages[k].input_saved is False
        else 0
        for k in range(1, len(stages))
    ]
    return StageTerms(forward_all, backward, weight_grads, freed)
