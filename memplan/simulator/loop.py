"""The optimizer in the training loop, as the simulator counts it: its own code, no solver's.

Two terms of docs/model.md ("The training loop") that the replay of a chain schedule adds to the
operations' memory (:mod:`.chain_memory`, :mod:`.combined`), read from the profile's fields and
the schedule's ``budget`` here, independently of :mod:`memplan.algorithms`:

* **the step after the backward** (``budget.optimizer_step`` set, ``budget.gradients``
  ``at-backward`` or ``kept``): once the last ``B`` has run, ``optimizer.step()`` holds what the
  replay holds then (static memory, the gradients), the caller's batch ``x[0]`` (which the chain
  lets go at ``B 0``) and its temporaries (:func:`step_temporaries`); the replay's peak is at
  least that;
* **the step in the backward** (``budget.gradients`` ``step-in-backward``): ``B k`` steps, at its
  end, the parameters stage ``k`` uses first and frees their gradients
  (``first_use_grad_size[k]``), and holds the step's temporaries for the largest of them during
  it (:func:`stepped_in_backward`).

The temporaries, per step kind (measured, docs/model.md): a fused step none; a foreach step one
copy of the gradients of a parameter group for Adam and AdamW (their square-root buffer), and for
SGD when the step copies the gradients; a for-loop step, parameter by parameter (in the profile's
``parameter_sizes`` order, a 0 between groups; else one per stage), for Adam two copies of the
parameter it steps and the denominator of the one before (three and one when it copies the
gradients), for SGD one copy of the parameter when it copies them.
"""

from __future__ import annotations

from memplan.profile.model import Profile, Stage
from memplan.schedule import Budget


def _grads(stage: Stage) -> int:
    """The gradient bytes ``B k`` creates: ``weight_grad_size``, else the stage's weights."""
    return stage.weight_size if stage.weight_grad_size is None else stage.weight_grad_size


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
    # two scalar tensors (4 and 8 bytes): Adam's with its buffers, momentum's (not fused) alone
    if adam:
        return worst + 12
    if name == "momentum" and step != "fused":
        return max(worst, 12)
    return worst


def _grads_in_order(profile: Profile) -> list[int]:
    """The gradients in the order the optimizer steps them.

    ``parameter_sizes``, else the stages' (one per stage, in order).
    """
    if profile.parameter_sizes is not None:
        return list(profile.parameter_sizes)
    return [_grads(st) for st in profile.all_stages()]


def step_temporaries(profile: Profile, budget: Budget) -> int | None:
    """The temporaries of the step after the backward; None when the replay counts no such step
    (no ``optimizer_step``, optimizer ``none``, no loop, or the step in the backward).
    """
    if (
        budget.optimizer_step is None
        or budget.optimizer == "none"
        or budget.gradients not in ("at-backward", "kept")
    ):
        return None
    return _temporaries(budget, _grads_in_order(profile))


def stepped_in_backward(profile: Profile, budget: Budget) -> tuple[list[int], list[int]]:
    """Per stage ``k`` under ``step-in-backward``: the gradient bytes ``B k`` steps and frees at
    its end, and the step's temporaries during ``B k`` (one parameter at a time, its largest).
    Zeros under the other loops and with optimizer ``none``.
    """
    stages = profile.chain_stages
    if budget.gradients != "step-in-backward" or budget.optimizer == "none":
        return [0] * len(stages), [0] * len(stages)
    freed = [
        _grads(st) if st.first_use_grad_size is None else st.first_use_grad_size for st in stages
    ]
    temporaries = []
    for st, size in zip(stages, freed, strict=True):
        largest = size if st.largest_grad_size is None else st.largest_grad_size
        temporaries.append(_temporaries(budget, [largest]))  # one parameter at a time
    return freed, temporaries
