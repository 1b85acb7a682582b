"""The optimizer's step, as the budget counts it, is what PyTorch's step holds (docs/model.md,
"Static memory and budgets"; NOTE [ optimizer step temporaries ] in memplan/loop.py).

For each optimizer memplan knows (SGD, momentum, Nesterov, weight decay; Adam and AdamW; PyTorch's
for-loop, foreach and fused steps; two parameter groups), on parameters of mixed sizes in an order
where a large one follows a middling one: the peak of ``optimizer.step()`` beyond the weights,
the gradients and the state, by the allocator's events, is exactly what
:meth:`memplan.loop.Optimizer.step_temporaries` says for the optimizer as
:func:`memplan.torch.base.optimizers.describe_optimizer` reads it, and what the simulator's own
count says (memplan/simulator/loop.py); the state is as many copies of the gradients as counted.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from memplan.schedule import Budget  # noqa: E402
from memplan.simulator.terms import step_temporaries as replayed  # noqa: E402
from memplan.torch.base.optimizers import describe_optimizer  # noqa: E402
from memplan.torch.measure.allocator_peak import allocator_peak  # noqa: E402
from memplan.torch.profiler.model import parameter_sizes  # noqa: E402

pytestmark = pytest.mark.torch

CASES = {
    "sgd": lambda groups: torch.optim.SGD(groups, lr=0.1),
    "sgd-foreach": lambda groups: torch.optim.SGD(groups, lr=0.1, foreach=True),
    "sgd-decay": lambda groups: torch.optim.SGD(groups, lr=0.1, weight_decay=0.1),
    "sgd-decay-foreach": lambda groups: torch.optim.SGD(
        groups, lr=0.1, weight_decay=0.1, foreach=True
    ),
    "momentum": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9),
    "momentum-foreach": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, foreach=True),
    "momentum-fused": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, fused=True),
    "nesterov": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda groups: torch.optim.Adam(groups, lr=0.1),
    "adam-foreach": lambda groups: torch.optim.Adam(groups, lr=0.1, foreach=True),
    "adam-fused": lambda groups: torch.optim.Adam(groups, lr=0.1, fused=True),
    "adam-decay": lambda groups: torch.optim.Adam(groups, lr=0.1, weight_decay=0.1),
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=0.1),
    "adamw-foreach": lambda groups: torch.optim.AdamW(groups, lr=0.1, foreach=True),
    "adamw-fused": lambda groups: torch.optim.AdamW(groups, lr=0.1, fused=True),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    # a middling weight, then the largest, then small ones: a for-loop step's peak is at the
    # largest with the one before it
    return nn.Sequential(nn.Linear(300, 200), nn.Linear(200, 1000), nn.Linear(1000, 10))


def _bytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_step_holds_what_is_counted(name, grouped):
    model = _model()
    params = list(model.parameters())
    groups = (
        [{"params": params[:3]}, {"params": params[3:], "weight_decay": 0.0}] if grouped else params
    )
    optimizer = CASES[name](groups)
    x = torch.randn(4, 300)
    extras = []
    for _ in range(3):  # the first step makes the state; the steady state after
        optimizer.zero_grad(set_to_none=True)
        model(x).sum().backward()
        state = [t for s in optimizer.state.values() for t in s.values()]
        held = [*params, *(p.grad for p in params), *state]
        base = _bytes(params) + _bytes(p.grad for p in params) + _bytes(state)
        peak, _ = allocator_peak(optimizer.step, held, torch.device("cpu"))
        extras.append(peak - base)
    seen = describe_optimizer(optimizer)
    sizes = parameter_sizes([g["params"] for g in optimizer.param_groups], torch.device("cpu"))
    assert extras[-1] == seen.step_temporaries(sizes), (name, extras, sizes)
    state = sum(_bytes(s.values()) for s in optimizer.state.values())
    steps = sum(1 for s in optimizer.state.values() if "step" in s)
    assert state - 4 * steps == seen.state_copies * _bytes(params)
    budget = Budget.of(None, _loop(seen))
    profile = _profile(sizes)
    assert replayed(profile, budget) == extras[-1]


def _loop(optimizer):
    from memplan.loop import TrainingLoop

    return TrainingLoop(optimizer, "at-backward")


def _profile(sizes):
    from memplan.profile.model import Profile, Stage

    stage = Stage(
        name="s", forward_time=1.0, backward_time=1.0, output_size=1, saved_size=1,
        weight_size=sum(sizes), weight_grad_size=sum(sizes),
    )  # fmt: skip
    return Profile(model="p", input_size=1, stages=[stage], parameter_sizes=sizes)
