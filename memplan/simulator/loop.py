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
copy of every gradient for Adam and AdamW (their square-root buffer), and for SGD when the step
copies the gradients; a for-loop step, parameter by parameter, two copies of the largest for Adam
(three when it copies the gradients), one for SGD when it copies them.
"""

from __future__ import annotations

from memplan.profile.model import Profile, Stage
from memplan.schedule import Budget


def _grads(stage: Stage) -> int:
    """The gradient bytes ``B k`` creates: ``weight_grad_size``, else the stage's weights."""
    return stage.weight_size if stage.weight_grad_size is None else stage.weight_grad_size


def _temporaries(budget: Budget, every: int, largest: int) -> int:
    """What one ``optimizer.step()`` over gradients of ``every`` bytes (the largest ``largest``)
    holds besides them, the weights and the state.
    """
    name, step = budget.optimizer or "sgd", budget.optimizer_step
    if step is None or step == "fused" or name == "none":
        return 0
    adam = name in ("adam", "adamw")
    copies = bool(budget.optimizer_copies_grads)
    if step == "foreach":
        return every if adam or copies else 0
    return largest * ((2 if adam else 0) + (1 if copies else 0))


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
    stages = profile.all_stages()
    every = sum(_grads(st) for st in stages)
    largest = max(
        (_grads(st) if st.largest_grad_size is None else st.largest_grad_size for st in stages),
        default=0,
    )
    return _temporaries(budget, every, largest)


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
        temporaries.append(_temporaries(budget, largest, largest))
    return freed, temporaries
