"""The memory terms the simulator counts, computed here from the profile's fields and the
schedule's budget alone.

NOTE [ simulator memory terms ]
The simulator is the independent check of every solver (docs/model.md, "Who computes what"): it
shares no memory term with them. The solvers read theirs from memplan/profile/memory.py
(``stage_terms``, ``static_bytes``) and memplan/algorithms; the simulator reads the profile's
fields and docs/model.md, and computes every term below itself, here:

* **static memory** (:func:`static_memory`), present for the whole step: the weights ``W`` (the
  sum of every stage's ``weight_size``) times the copies of :data:`WEIGHT_COPIES` (weights,
  gradients, optimizer state), less the gradients (``W``) when ``budget.gradients`` is
  ``at-backward``, plus the profile's ``workspace_size``; 0 with the optimizer ``none`` (a budget
  for activations alone). A graph holds its own weights (the graph's ``weight_size``);
* **a stage's loop terms** (:func:`stage_loops`, one :class:`StageLoop` per stage), under
  ``budget.gradients`` (None: the model before the loop's terms, every term the stage's
  ``forward_overhead`` / ``backward_overhead``, nothing created or freed):

  - ``F_all k`` adds ``forward_overhead_all`` (else ``forward_overhead``) beyond ``s[k]``;
  - ``B k`` adds ``backward_overhead_fresh`` (else ``backward_overhead``) under ``at-backward``,
    ``backward_overhead`` under ``kept``, and creates ``weight_grad_size`` bytes (else the
    stage's ``weight_size``; 0 under ``kept`` or with the optimizer ``none``), which stay to
    the optimizer's step;
  - ``F_all k`` frees its input ``x[k]`` (the bytes of the previous stage's ``output_size``) when
    the stage before keeps no output (``output_saved`` false) and stage ``k`` keeps no input
    (``input_saved`` false); never the chain's (or a branch's) input;
* **the turn of a join** (:func:`turn_loop`): the same terms for the loss stage joining the
  branches; its forward frees each branch output whose last stage keeps no output, when the turn
  keeps no input.

Where a new term goes: a new optimizer's copies in :data:`WEIGHT_COPIES` (its step temporaries
in :func:`static_memory`, or a term of its own beside it); a new training loop's terms in
:func:`stage_loops` (and :func:`turn_loop`), and in the solvers' memplan/profile/memory.py,
written separately. tests/simulator/test_terms.py compares both on random profiles, and shows
that the replay rejects a plan made with one term wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memplan.profile.model import Profile, Stage

WEIGHT_COPIES: dict[str, int] = {"none": 0, "sgd": 2, "momentum": 3, "adam": 4}
"""Copies of the weights present for the whole step, by optimizer (docs/model.md, "Static memory
and budgets"): the weights, their gradients and the optimizer's state (momentum: one buffer;
adam: two)."""

AT_BACKWARD = "at-backward"
"""The loop where each stage's weight gradients appear at its backward (docs/model.md)."""


def static_memory(profile: Profile, optimizer: str, gradients: str | None) -> int | None:
    """Bytes present for the whole step of a chain, join or graph schedule (NOTE [ simulator
    memory terms ]); None for a pipeline (its simulator counts each GPU's own weights).

    Raises
    ------
    KeyError
        An optimizer the simulator does not know (the schedule's validation admits none).
    """
    if profile.graph is not None and profile.stages is None and profile.branches is None:
        return profile.graph.weight_size
    if optimizer == "none":
        return 0
    weights = sum(stage.weight_size for stage in _every_stage(profile))
    copies = WEIGHT_COPIES[optimizer] - (1 if gradients == AT_BACKWARD else 0)
    return copies * weights + (profile.workspace_size or 0)


def _every_stage(profile: Profile) -> list[Stage]:
    if profile.stages is not None:
        return list(profile.stages)
    if profile.branches is not None and profile.turn is not None:
        return [st for branch in profile.branches for st in branch.stages] + [profile.turn]
    return []


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


def stage_loops(
    stages: Sequence[Stage], gradients: str | None, optimizer: str = "sgd"
) -> list[StageLoop]:
    """The :class:`StageLoop` of every stage of a chain (or of one branch), in order."""
    return [
        _loop(st, stages[k - 1] if k > 0 else None, gradients, optimizer)
        for k, st in enumerate(stages)
    ]


def turn_loop(
    turn: Stage, lasts: Sequence[Stage | None], gradients: str | None, optimizer: str = "sgd"
) -> tuple[StageLoop, list[bool]]:
    """The turn's :class:`StageLoop` (``frees_input`` 0) and, per branch, whether its forward
    frees that branch's output; ``lasts``: each branch's last stage (None: an empty branch, whose
    output is its input, never freed).
    """
    own = _loop(turn, None, gradients, optimizer)
    frees = [
        gradients is not None and last is not None and _autograd_frees(last, turn) for last in lasts
    ]
    return own, frees


def _autograd_frees(before: Stage, stage: Stage) -> bool:
    """Whether autograd frees the tensor between ``before`` and ``stage`` after ``stage``'s
    forward: neither keeps it (docs/model.md, "autograd's frees").
    """
    return before.output_saved is False and stage.input_saved is False


def _loop(st: Stage, before: Stage | None, gradients: str | None, optimizer: str) -> StageLoop:
    if gradients is None:
        return StageLoop(st.forward_overhead, st.backward_overhead, 0, 0)
    fresh = gradients == AT_BACKWARD
    created = 0
    if fresh and optimizer != "none":
        created = st.weight_size if st.weight_grad_size is None else st.weight_grad_size
    backward = st.backward_overhead
    if fresh and st.backward_overhead_fresh is not None:
        backward = st.backward_overhead_fresh
    forward_all = st.forward_overhead
    if st.forward_overhead_all is not None:
        forward_all = st.forward_overhead_all
    freed = 0
    if before is not None and _autograd_frees(before, st):
        freed = before.output_size
    return StageLoop(forward_all, backward, created, freed)
