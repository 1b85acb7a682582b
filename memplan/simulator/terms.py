"""The memory terms the simulator counts, computed here from the profile's fields and the
schedule's budget alone.

NOTE [ simulator memory terms ]
The simulator is the independent check of every solver (docs/model.md, "Who computes what"): it
shares no memory term with them. The solvers read theirs from memplan/profile/memory.py
(``stage_terms``, ``static_bytes``), memplan/loop.py (the optimizer step's temporaries) and
memplan/algorithms; the simulator reads the profile's fields, the schedule's ``budget`` and
docs/model.md, and computes every term below itself, here:

* **static memory** (:func:`static_memory`), present for the whole step: the weights ``W`` (every
  stage's ``weight_size``: parameters, buffers, step counts; and the profile's
  ``unreached_weight_size``, the parameters and buffers in no stage, which the backward never
  reaches: weights alone, no gradient, no state), the optimizer's state
  (:data:`STATE_COPIES` copies of the gradients ``G``, each stage's ``weight_grad_size``, else its
  ``weight_size``), the gradients ``G`` themselves unless ``budget.gradients`` makes them appear
  in the backward (``at-backward``, ``step-in-backward``), the profile's ``workspace_size``, three
  copies of its ``side_gradient_size`` (a tensor every block reads, its gradient summed by
  autograd, and one block's share of it) and,
  when the caller holds the model's output (``budget.output_held``), the bytes it holds
  (``budget.output_bytes``, else the loss stage's input ``x[L-1]``); 0 with the optimizer
  ``none`` (a budget for activations alone). A graph holds its own weights (the graph's
  ``weight_size``);
* **a stage's loop terms** (:func:`stage_loops`, one :class:`StageLoop` per stage), under
  ``budget.gradients`` (None: the model before the loop's terms, every term the stage's
  ``forward_overhead`` / ``backward_overhead``, nothing created or freed):

  - ``F_all k`` adds ``forward_overhead_all`` (else ``forward_overhead``) beyond ``s[k]``;
  - ``B k`` adds ``backward_overhead`` under ``kept``, else ``backward_overhead_fresh`` (when
    the profile has it), and creates ``G[k]`` (0 under ``kept`` or with the optimizer ``none``),
    which stay to the optimizer's step;
  - under ``step-in-backward``, ``B k`` also holds the step's temporaries for one parameter (the
    stage's ``largest_grad_size``, else its ``first_use_grad_size``) and, at its end, steps and
    frees the gradients it completes (``first_use_grad_size``, else ``G[k]``);
  - ``F_all k`` frees its input ``x[k]`` (the bytes of the previous stage's ``output_size``) when
    the stage before keeps no output (``output_saved`` false) and stage ``k`` keeps no input
    (``input_saved`` false), and the loss's forward frees its input when the caller holds the
    output (the caller's copy, static, serves the loss's backward); never the chain's (or a
    branch's) input;
  - ``B k`` runs without its output ``x[k+1]`` (part of ``s[k]``: its overhead is that much
    lower) when stage ``k`` keeps no output (``output_saved`` false) while the next stage of its
    chain or branch kept it as its input (``input_saved`` true), unless the loss's forward freed
    it (the caller holds the output): that stage's backward, which comes first, let it go;
* **the turn of a join** (:func:`turn_loop`): the same terms for the loss stage joining the
  branches; its forward frees each branch output whose last stage keeps no output, when the turn
  keeps no input;
* **the optimizer's step after the backward** (:func:`step_temporaries`, with
  ``budget.optimizer_step`` under ``at-backward`` or ``kept``): once the last ``B`` has run,
  ``optimizer.step()`` holds what the replay holds then, the caller's batch (which the plan lets
  go at its last backward) and its temporaries, in the profile's ``parameter_sizes`` order (a 0
  between groups; else one parameter per stage): a fused step none; a foreach step the gradients
  of a parameter group for Adam (its square-root buffer), and for SGD when the step copies the
  gradients (``optimizer_copies_grads``); a for-loop step, parameter by parameter, two copies of
  the parameter Adam steps and the denominator of the one before (one more copy of the parameter
  when it copies the gradients; SGD: that copy alone); Adam's steps 12 bytes of scalars more,
  momentum's (not fused) at least those.

Where a new term goes: a new optimizer in :data:`STATE_COPIES` (and its step in
:func:`_temporaries`); a new training loop's terms in :func:`stage_loops` (and :func:`turn_loop`),
and in the solvers' memplan/profile/memory.py, written separately. tests/simulator/test_terms.py
compares both on random profiles, and shows that the replay rejects a plan made with one term
wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from memplan.profile.model import Profile, Stage
from memplan.schedule import Budget

STATE_COPIES: dict[str, int] = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
"""The optimizer's state in copies of the gradients, by optimizer (docs/model.md, "Static memory
and budgets"): momentum one buffer, Adam and AdamW two moments."""

SCALARS = 12
"""Bytes of the two scalar tensors (4 and 8 bytes) of an Adam step, and of a momentum step at a
moment it holds no buffer (docs/model.md, measured)."""

_IN_BACKWARD = ("at-backward", "step-in-backward")
"""The loops where each stage's gradients appear at its backward (docs/model.md)."""


def static_memory(profile: Profile, budget: Budget) -> int | None:
    """Bytes present for the whole step of a chain, join or graph schedule (NOTE [ simulator
    memory terms ]).

    Raises
    ------
    KeyError
        An optimizer the simulator does not know (the schedule's validation admits none).
    """
    if profile.graph is not None and profile.stages is None and profile.branches is None:
        return profile.graph.weight_size
    optimizer = budget.optimizer or "sgd"  # the CLI's default, as claims.optimizer_of
    if optimizer == "none":
        return 0
    every = _every_stage(profile)
    outside = profile.unreached_weight_size or 0  # in no stage: weights alone, no gradient
    weights = sum(stage.weight_size for stage in every) + outside
    grads = sum(_grads(stage) for stage in every)
    kept = 0 if budget.gradients in _IN_BACKWARD else grads
    held = 0
    if budget.output_held:
        held = _output(profile) if budget.output_bytes is None else budget.output_bytes
    state = STATE_COPIES[optimizer] * grads
    summed = 3 * (profile.side_gradient_size or 0)  # the tensor, the blocks' sum, one share
    return weights + state + kept + (profile.workspace_size or 0) + held + summed


def _every_stage(profile: Profile) -> list[Stage]:
    if profile.stages is not None:
        return list(profile.stages)
    if profile.branches is not None and profile.turn is not None:
        return [st for branch in profile.branches for st in branch.stages] + [profile.turn]
    return []


def _grads(stage: Stage) -> int:
    """The gradient bytes ``B k`` creates: ``weight_grad_size``, else the stage's weights."""
    return stage.weight_size if stage.weight_grad_size is None else stage.weight_grad_size


def _output(profile: Profile) -> int:
    """The model's output a caller holds: the loss stage's input ``x[L-1]`` (0 for a one-stage
    chain, whose input is the batch, and for a join, whose loss reads every branch).
    """
    stages = profile.stages or []
    return stages[-2].output_size if len(stages) >= 2 else 0


@dataclass(frozen=True)
class StageLoop:
    """What the training loop adds to one stage's operations, in bytes (NOTE [ simulator memory
    terms ]).
    """

    forward_all: int
    """``F_all``'s overhead beyond what it saves."""
    backward: int
    """``B``'s overhead beyond the input gradient and the weight gradients it creates."""
    weight_grads: int
    """The weight gradients ``B`` creates, which stay to the optimizer's step."""
    frees_input: int
    """The bytes of the stage's input that ``F_all`` frees at its end (0: none)."""
    steps: int = 0
    """Under ``step-in-backward``: the gradients ``B`` steps and frees at its end."""
    step_temporaries: int = 0
    """Under ``step-in-backward``: what the step holds during ``B`` besides them."""


def stage_loops(
    stages: Sequence[Stage], budget: Budget | None, loss: bool = True
) -> list[StageLoop]:
    """The :class:`StageLoop` of every stage of a chain (``loss``: its last stage is the loss) or
    of one branch of a join (``loss`` False), in order; ``budget`` None: the model before the
    loop's terms.
    """
    loops = [_loop(st, stages[k - 1] if k > 0 else None, budget) for k, st in enumerate(stages)]
    held = budget is not None and budget.gradients is not None and budget.output_held
    if held and loss and len(stages) >= 2:  # the caller's copy (static) serves the loss's B
        loops[-1] = replace(loops[-1], frees_input=stages[-2].output_size)
    if budget is None or budget.gradients is None:
        return loops
    for k in range(len(stages) - 1):
        if loops[k + 1].frees_input == 0 and _let_go_at_next_backward(stages[k], stages[k + 1]):
            loops[k] = replace(loops[k], backward=loops[k].backward - stages[k].output_size)
    return loops


def _let_go_at_next_backward(stage: Stage, after: Stage) -> bool:
    """Whether ``stage``'s output is gone when its backward runs.

    It does not keep it, the next stage keeps it as its input and frees it at its own backward,
    which comes first (docs/model.md, "an output the next stage kept").
    """
    return stage.output_saved is False and after.input_saved is True


def turn_loop(
    turn: Stage, lasts: Sequence[Stage | None], budget: Budget | None
) -> tuple[StageLoop, list[bool]]:
    """The turn's :class:`StageLoop` (``frees_input`` 0) and, per branch, whether its forward
    frees that branch's output; ``lasts``: each branch's last stage (None: an empty branch, whose
    output is its input, never freed).
    """
    own = _loop(turn, None, budget)
    loop = budget is not None and budget.gradients is not None
    frees = [loop and last is not None and _autograd_frees(last, turn) for last in lasts]
    return own, frees


def _autograd_frees(before: Stage, stage: Stage) -> bool:
    """Whether autograd frees the tensor between ``before`` and ``stage`` after ``stage``'s
    forward: neither keeps it (docs/model.md, "autograd's frees").
    """
    return before.output_saved is False and stage.input_saved is False


def _loop(st: Stage, before: Stage | None, budget: Budget | None) -> StageLoop:
    gradients = None if budget is None else budget.gradients
    if budget is None or gradients is None:
        return StageLoop(st.forward_overhead, st.backward_overhead, 0, 0)
    fresh = gradients in _IN_BACKWARD
    counted = fresh and budget.optimizer != "none"
    created = _grads(st) if counted else 0
    backward = st.backward_overhead
    if fresh and st.backward_overhead_fresh is not None:
        backward = st.backward_overhead_fresh
    forward_all = st.forward_overhead
    if st.forward_overhead_all is not None:
        forward_all = st.forward_overhead_all
    freed = 0
    if before is not None and _autograd_frees(before, st):
        freed = before.output_size
    steps = temporaries = 0
    if gradients == "step-in-backward" and counted:
        steps = _grads(st) if st.first_use_grad_size is None else st.first_use_grad_size
        largest = steps if st.largest_grad_size is None else st.largest_grad_size
        temporaries = _temporaries(budget, [largest])  # one parameter at a time
    return StageLoop(forward_all, backward, created, freed, steps, temporaries)


def step_temporaries(profile: Profile, budget: Budget) -> int | None:
    """The temporaries of the optimizer's step after the backward (NOTE [ simulator memory
    terms ]); None when the replay counts no such step (no ``optimizer_step``, optimizer
    ``none``, no loop, or the step in the backward).
    """
    if (
        budget.optimizer_step is None
        or budget.optimizer == "none"
        or budget.gradients not in ("at-backward", "kept")
    ):
        return None
    if profile.parameter_sizes is not None:
        ordered = list(profile.parameter_sizes)
    else:
        ordered = [_grads(st) for st in _every_stage(profile)]
    return _temporaries(budget, ordered)


def _temporaries(budget: Budget, sizes: list[int]) -> int:
    """What one ``optimizer.step()`` holds besides the gradients, the weights and the state.

    ``sizes``: the gradients in the order the step goes through them, 0 between groups.
    """
    name, step = budget.optimizer or "sgd", budget.optimizer_step
    if step is None or name == "none":
        return 0
    adam = name in ("adam", "adamw")
    copies = bool(budget.optimizer_copies_grads)
    worst = 0
    if step == "foreach" and (adam or copies):
        group = 0
        for size in sizes:
            group = group + size if size else 0
            worst = max(worst, group)
    elif step == "for-loop":
        own = (2 if adam else 0) + (1 if copies else 0)
        previous = 0
        for size in sizes:
            worst = max(worst, own * size + (previous if adam else 0))
            previous = size
    if adam:  # Adam's scalars are there with its buffers
        return worst + SCALARS
    if name == "momentum" and step != "fused":  # momentum's, at a moment it holds no buffer
        return max(worst, SCALARS)
    return worst
