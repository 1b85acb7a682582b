"""What a chain profile says about memory in the user's training loop: the terms of docs/model.md.

NOTE [ training-loop memory terms ]
A chain schedule is planned and replayed under one of three loops, recorded in the schedule's
``budget.gradients`` (the names: :mod:`memplan.loop`):

* ``at-backward`` (PyTorch's default loop, ``zero_grad(set_to_none=True)``): the static memory is
  the weights and the optimizer state; the parameter gradients of stage ``k``
  (``weight_grad_size[k]``, the stage's ``weight_size`` when the profile lacks it) appear when
  ``B k`` starts and stay to the optimizer's step; ``B k``'s temporaries are
  ``backward_overhead_fresh[k]`` (``backward_overhead`` when the profile lacks it);
* ``kept`` (a loop that keeps its gradient buffers: ``zero_grad(set_to_none=False)``, gradient
  accumulation): the gradients are static memory for the whole step, ``B k``'s temporaries are
  ``backward_overhead[k]``;
* ``step-in-backward`` (the optimizer step applied in the backward,
  ``register_post_accumulate_grad_hook``): ``B k`` creates its gradients as under ``at-backward``
  and, at its end, the parameters it uses first (``first_use_grad_size[k]``: a gradient shared by
  several stages is complete at its first user's backward) are stepped and their gradients freed;
  during ``B k`` the step holds its temporaries for the largest of them (``largest_grad_size[k]``);
  nothing is left for a step after the backward.

Under each, what the profile measured of autograd applies: ``F_all k`` adds
``forward_overhead_all[k]`` (``forward_overhead`` when the profile lacks it), and ``F_all k``
frees ``x[k]`` (as ``s[k-1]``'s part, or the standalone checkpoint) when neither stage ``k-1``
keeps its output (``output_saved``) nor stage ``k`` its input (``input_saved``): a language
model's logits after the loss's forward. ``B k`` then does not need ``x[k]``. Otherwise, when
stage ``k`` does not keep its output but stage ``k+1`` keeps it as its input, ``B k+1`` frees it:
``B k`` runs without ``x[k+1]`` (:func:`_released`, taken off ``B k``'s temporaries).

The optimizer (``budget.optimizer``): its state is static, ``state_copies`` times the gradients
(:func:`gradient_bytes`). With ``budget.optimizer_step`` (the step PyTorch runs), the step after
the backward (``at-backward`` and ``kept``) is part of the peak: the static memory, ``x[0]``, the
gradients and the step's temporaries (NOTE [ optimizer step temporaries ] in memplan/loop.py).

The caller's output (``budget.output_held``): a loop that holds the model's output until its next
step (``out = model(**batch)``) holds the loss stage's input ``x[L-1]`` (:func:`held_output_bytes`)
from one step to the next: one copy is static, and the chain's own copy is freed after the loss's
forward, as autograd frees it when nobody holds it (the caller's serves ``B L-1``).

Every family of the chain model (chain, offloading, combined) and the join family plans in these
terms: the step in the backward is folded into each stage's (:class:`StageTerms`), and the step
after the backward bounds every family's plans alike (``step_bound`` in
:mod:`memplan.algorithms.timeline`). A schedule without ``budget.gradients`` (written before these
terms existed, graph and pipeline schedules) is planned and replayed in the model before them:
gradients static, ``forward_overhead`` for every forward, no frees, no step.

For the solvers only (:mod:`memplan.algorithms.chain.problem`, ``OffloadInstance``, ``JoinNet``,
:mod:`memplan.algorithms.timeline`): it says what the profile's fields mean, not how a plan is
made or checked. The simulator computes every term again with its own code, from docs/model.md
(NOTE [ simulator memory terms ] in memplan/simulator/terms.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memplan.loop import AUTO, Gradients, Optimizer, TrainingLoop, check_gradients
from memplan.profile.model import Profile, Stage


def measured(profile: Profile) -> bool:
    """Whether the profile was measured by memplan's profiler with the default loop's fields."""
    stages = (profile.stages or []) if profile.kind == "chain" else []
    return any(st.weight_grad_size is not None for st in stages)


def resolve_gradients(profile: Profile, gradients: str | None) -> Gradients:
    """The loop ``auto`` stands for on ``profile``.

    ``at-backward`` on a profile with ``weight_grad_size`` (measured in PyTorch's loop), ``kept``
    on one without (the bundled profiles of the papers and estimates: their figures, and a bound
    that holds for any loop).
    """
    chosen = check_gradients(gradients)
    if chosen == AUTO:
        return "at-backward" if measured(profile) else "kept"
    return chosen  # type: ignore[return-value]


def loop_on(
    profile: Profile,
    optimizer: Optimizer,
    gradients: str | None = AUTO,
    output_held: bool = False,
    terms: bool = True,
    output_bytes: int | None = None,
) -> TrainingLoop:
    """The loop a plan on ``profile`` is made for.

    With the loop's terms (``terms``: the chain, offloading, combined and join families'), the
    optimizer's step PyTorch's default on the profile's device when not given and ``gradients``
    resolved (:func:`resolve_gradients`); without them (graph, pipeline), the optimizer's state
    alone.
    """
    if not terms:
        return TrainingLoop(Optimizer(optimizer.name))
    kind = profile.device.kind if profile.device is not None else None
    return TrainingLoop(
        optimizer.with_default_step(kind),
        resolve_gradients(profile, gradients),
        output_held,
        output_bytes if output_held else None,
    )


def stage_gradients(stage: Stage) -> int:
    """Bytes of the parameter gradients a stage's backward creates.

    ``weight_grad_size``, else ``weight_size``.
    """
    return stage.weight_size if stage.weight_grad_size is None else stage.weight_grad_size


def gradient_bytes(profile: Profile) -> int:
    """Bytes of every parameter gradient: what the optimizer's state is counted in."""
    if profile.kind == "graph":
        return profile.weight_size
    return sum(stage_gradients(st) for st in profile.all_stages())


def parameter_sizes(profile: Profile) -> list[int]:
    """The parameters' gradients in the order the optimizer steps them (``parameter_sizes``).

    A profile without them: each stage's gradients as one parameter, in stage order, which
    bounds what a step over the parameters holds (the model's own order following its stages).
    """
    if profile.parameter_sizes is not None:
        return list(profile.parameter_sizes)
    return [stage_gradients(st) for st in profile.all_stages()]


def held_output_bytes(profile: Profile) -> int:
    """Bytes of the model's output, the loss stage's input ``x[L-1]``.

    0 for a one-stage chain, whose input ``x[0]`` is counted anyway.
    """
    stages = profile.stages or []
    return stages[-2].output_size if len(stages) >= 2 else 0


def static_bytes(profile: Profile, loop: TrainingLoop) -> int:
    """Static memory of a chain-model schedule: what the step holds from its start to its end.

    The weights (``weight_size``: parameters, buffers, step counts), the optimizer state
    (``state_copies`` times the gradients), the gradients when they are kept for the whole step
    (``kept``, or the model before the loop's terms), the math libraries' workspace
    (``workspace_size``: cuBLAS keeps it from the first step on), the weights outside every stage
    (``unreached_weight_size``: no gradient, no state), a tensor computed from parameters that
    the blocks read besides their hidden state, the gradient autograd sums from them and one
    reader's share of it (three times ``side_gradient_size``) and, when the caller holds it, one
    copy of the model's output. Optimizer ``none``: a budget for the activations alone.
    """
    optimizer = loop.optimizer
    if optimizer.name == "none":
        return 0
    gradients = gradient_bytes(profile)
    kept = gradients if loop.gradients in (None, "kept") else 0
    held = 0
    if loop.output_held:
        held = held_output_bytes(profile) if loop.output_bytes is None else loop.output_bytes
    state = optimizer.state_copies * gradients
    weights = profile.weight_size + (profile.unreached_weight_size or 0)
    side = 3 * (profile.side_gradient_size or 0)  # the tensor, the sum, one block's share
    return weights + state + kept + (profile.workspace_size or 0) + held + side


@dataclass(frozen=True)
class StageTerms:
    """The training loop's terms of each stage ``k`` of a chain, in bytes.

    What ``F_all k`` adds beyond ``s[k]`` (``forward_all``), what ``B k`` adds beyond ``g[k]``
    (``backward``: its temporaries), the parameter gradients ``B k`` leaves held at its end
    (``weight_grads``) and the bytes of ``x[k]`` that ``F_all k`` frees (``freed_input``, 0 for
    the chain input).

    Under ``step-in-backward`` the step in the backward is folded into them, so that every
    family's rules hold unchanged: ``B k`` steps and frees, at its end, the gradients it completes
    (``first_use_grad_size[k]``) and holds the step's temporaries during it; ``backward`` grows by
    both (``in_backward[k]``, which an option's own backward overhead takes too) and
    ``weight_grads`` is what ``B k`` creates less what it steps (negative at a stage that completes
    a gradient a later stage's backward created: a tied embedding).
    """

    forward_all: list[int]
    backward: list[int]
    weight_grads: list[int]
    freed_input: list[int]
    in_backward: list[int]


def _stepped_in_backward(
    stages: Sequence[Stage], optimizer: Optimizer
) -> tuple[list[int], list[int]]:
    """Per stage, under ``step-in-backward``: what ``B k`` steps and holds.

    The gradient bytes it steps and frees at its end, and the step's temporaries during it (one
    parameter at a time: its largest).
    """
    stepped = [
        stage_gradients(st) if st.first_use_grad_size is None else st.first_use_grad_size
        for st in stages
    ]
    largest = [
        size if st.largest_grad_size is None else st.largest_grad_size
        for st, size in zip(stages, stepped, strict=True)
    ]
    return stepped, [optimizer.step_temporaries([size]) for size in largest]


def _released(stages: Sequence[Stage], freed: Sequence[int]) -> list[int]:
    """Per stage ``k``, the bytes of ``x[k+1]`` that ``B k`` runs without.

    Stage ``k`` does not keep its output (``output_saved`` false) and stage ``k+1`` kept it as its
    input, which ``B k+1`` freed (``x[k+1]`` is still part of ``s[k]`` in the chain model; a
    standalone ``x[k+1]`` does not outlive ``B k+1``). 0 where ``F_all k+1`` frees it already
    (``freed``).
    """
    return [
        st.output_size
        if k + 1 < len(stages)
        and st.output_saved is False
        and stages[k + 1].input_saved is True
        and freed[k + 1] == 0
        else 0
        for k, st in enumerate(stages)
    ]


def stage_terms(stages: Sequence[Stage], loop: TrainingLoop | None) -> StageTerms:
    """The terms of NOTE [ training-loop memory terms ] for ``stages``.

    ``loop`` None, or a loop without ``gradients``: the model before them (every term as
    ``forward_overhead`` / ``backward_overhead``, nothing created or freed). With optimizer
    ``none`` the budget is for activations alone: no weight gradients.
    """
    zeros = [0] * len(stages)
    if loop is None or loop.gradients is None:
        return StageTerms(
            [st.forward_overhead for st in stages],
            [st.backward_overhead for st in stages],
            zeros,
            zeros,
            zeros,
        )
    fresh = loop.gradients != "kept"
    counted = fresh and loop.optimizer.name != "none"
    weight_grads = [stage_gradients(st) if counted else 0 for st in stages]
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
    if loop.output_held and len(stages) >= 2:  # the caller's copy serves the loss's backward
        freed[-1] = stages[-2].output_size
    backward = [a - b for a, b in zip(backward, _released(stages, freed), strict=True)]
    in_backward = zeros
    if loop.gradients == "step-in-backward" and counted:
        stepped, temporaries = _stepped_in_backward(stages, loop.optimizer)
        in_backward = [a + b for a, b in zip(stepped, temporaries, strict=True)]
        backward = [a + b for a, b in zip(backward, in_backward, strict=True)]
        weight_grads = [a - b for a, b in zip(weight_grads, stepped, strict=True)]
    return StageTerms(forward_all, backward, weight_grads, freed, in_backward)
