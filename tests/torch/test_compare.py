"""memplan.torch.compare.training and its meter: every way of training measured on the same footing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from memplan.errors import InputError  # noqa: E402
from memplan.torch.compare import ways as compare_ways  # noqa: E402
from memplan.torch.compare.training import compare_training, gradient_agreement  # noqa: E402
from memplan.torch.compare.ways import default_segments  # noqa: E402
from memplan.torch.measure.allocator_peak import allocator_peak, profiled_copy  # noqa: E402
from memplan.torch.measure.step import measure_step  # noqa: E402

pytestmark = pytest.mark.torch

F32 = 4


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10)
    )
    return model, torch.randn(32, 64)


class _Loss(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).square().mean()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_the_two_meters_agree(set_to_none):
    """The allocator's running total (compare's meter) and the replay of its events by address
    (measure_step's) are two readings of one step: the same peak."""
    model, x = _mlp()
    loss = _Loss(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    measure_step(loss, x, optimizer, set_to_none=set_to_none)  # the loop's steady state
    optimizer.zero_grad(set_to_none=set_to_none)
    batch = profiled_copy(x)
    held = [*model.parameters(), batch, *(p.grad for p in model.parameters())]

    def step():
        loss(batch).backward()
        optimizer.step()

    peak, _ = allocator_peak(step, held, x.device)
    again = measure_step(loss, x, optimizer, set_to_none=set_to_none)  # the same state
    assert peak == again.peak


def test_default_segments():
    assert default_segments(1) == []
    assert default_segments(4) == [2, 4]
    assert default_segments(10) == [2, 3, 4, 10]
    assert default_segments(36) == [2, 4, 6, 36]


@pytest.fixture(scope="module")
def mlp_comparison():
    model, x = _mlp()
    return compare_training(
        model, example_input=x, rounds=2, segments=[2], compile_budgets=(), repeats=1
    )


def test_every_way_is_measured_or_says_why(mlp_comparison):
    rows = {o.name: o for o in mlp_comparison.outcomes}
    plain = rows["plain"]
    assert plain.peak_ratio == 1.0 and plain.time_ratio == 1.0 and plain.grads == "equal"
    weights = sum(p.numel() for p in _mlp()[0].parameters()) * F32
    assert plain.peak >= 2 * weights + 32 * 64 * F32  # weights, gradients, the batch at least
    assert rows["hf checkpointing"].skipped == "not a Hugging Face model"
    for name in ("checkpoint_sequential(2)", "memplan store-all", "memplan rotor (least memory)"):
        row = rows[name]
        assert row.skipped is None and row.peak > 0, name
        assert row.grads == "equal", name  # recomputation reproduces plain training bit for bit
        assert len(row.time_ratios) == 2 and row.time_ratio > 0
    assert rows["memplan store-all"].planned_peak > 0
    # a store-all plan is given its own need as the budget (never a sentinel)
    assert rows["memplan store-all"].budget == rows["memplan store-all"].planned_peak
    assert "not a Hugging Face" in rows["hf checkpointing + loss in 8 chunks"].skipped
    # each measured memplan row against an alternative at equal memory: at X's peak, X
    for o in mlp_comparison.outcomes:
        if o.family != "memplan" or o.peak is None:
            continue
        assert o.versus in rows and rows[o.versus].family != "memplan", o.name
        assert o.versus_time > 0 and o.versus_peak == o.peak / rows[o.versus].peak
        if o.setting.startswith("at ") and o.setting.endswith("'s peak"):
            assert o.setting == f"at {o.versus}'s peak"
        else:
            fits = [r for r in rows.values() if r.family not in ("memplan",) and r.peak]
            fits = [r for r in fits if r.time_ratios and r.peak <= o.peak * 1.01]
            assert not fits or rows[o.versus] in fits
    # rotor is also planned at every other way's measured peak (feasible or not: it says)
    at = [o for o in mlp_comparison.outcomes if o.setting and o.setting.startswith("at ")]
    assert {o.budget for o in at} == {plain.peak, rows["checkpoint_sequential(2)"].peak}
    assert all(o.peak is not None or "no rotor plan fits" in o.skipped for o in at)
    doc = mlp_comparison.to_dict()
    assert doc["format"] == "memplan-bench/1" and doc["threads"] == 1
    assert [r["name"] for r in doc["rows"]] == [o.name for o in mlp_comparison.outcomes]


def test_a_way_that_cannot_compile_is_skipped_with_its_reason(monkeypatch):
    def broken(budget):
        def backend(graph, example_inputs):
            raise RuntimeError("no C++ compiler here")

        return backend

    monkeypatch.setattr(compare_ways, "compile_backend", broken)
    model, x = _mlp()
    found = compare_training(
        model, example_input=x, rounds=1, segments=(), compile_budgets=(0.5,),
        algos=("store-all",), repeats=1,
    )  # fmt: skip
    row = next(o for o in found.outcomes if o.family == "compile")
    assert row.peak is None and "no C++ compiler here" in row.skipped


def test_hugging_face_checkpointing_is_compared():
    pytest.importorskip("transformers")
    found = compare_training(
        "hf:gpt2",
        config="n_layer=2,n_embd=32,n_head=2,vocab_size=128,n_positions=32",
        batch_size=2,
        input_shape=(16,),
        rounds=1,
        segments=[2],
        compile_budgets=(),
        algos=("store-all",),
        repeats=1,
    )
    rows = {o.name: o for o in found.outcomes}
    hf = rows["hf checkpointing"]
    assert hf.skipped is None and hf.grads == "equal" and hf.peak > 0
    assert rows["memplan store-all"].grads == "equal"


def test_bad_options_are_input_errors():
    model, x = _mlp()
    with pytest.raises(InputError, match="rounds"):
        compare_training(model, example_input=x, rounds=0)
    with pytest.raises(InputError, match="compile budget"):
        compare_training(model, example_input=x, compile_budgets=(1.5,))
    with pytest.raises(InputError, match="example_input"):
        compare_training(model)
    with pytest.raises(InputError, match="segments 9"):
        compare_training(model, example_input=x, segments=[9], repeats=1)
    with pytest.raises(InputError, match="round_seconds 0"):
        compare_training(model, example_input=x, round_seconds=0)


@pytest.mark.parametrize(("seconds", "rounds"), [(1e-9, 1), (1e9, 3)])
def test_round_seconds_bounds_the_rounds(seconds, rounds):
    """As many rounds as fit in ``round_seconds``, one at least, ``rounds`` at most; every
    ratio comes from the rounds run."""
    model, x = _mlp()
    found = compare_training(
        model, example_input=x, rounds=3, round_seconds=seconds, segments=(),
        compile_budgets=(), algos=("store-all",), repeats=1,
    )  # fmt: skip
    assert found.rounds == rounds and found.to_dict()["rounds"] == rounds
    names = [o.name for o in found.outcomes]
    assert names == ["plain", "hf checkpointing", "hf checkpointing + loss in 8 chunks",
                     "memplan store-all"]  # fmt: skip
    for o in found.outcomes:
        assert o.skipped is not None or len(o.time_ratios) == rounds, o.name


def test_a_gradient_zero_but_for_rounding_is_compared_at_the_models_scale():
    """BERT's attention key bias: plain training's gradient is rounding (1e-12 beside 1e-2), and
    another order of the same sums changes it by its own size: ``close``; a small gradient that
    is wrong beyond rounding still ``differ``s, and a missing one."""
    big = torch.tensor([1e-2, -3e-3])
    noise = torch.tensor([7.8e-13, -2e-13])
    reference = [big, noise, None]
    assert gradient_agreement([big.clone(), noise.clone(), None], reference) == ("equal", 0.0)
    agreement, worst = gradient_agreement([big, torch.tensor([-7e-13, 1e-12]), None], reference)
    assert agreement == "close" and worst is not None and worst < 1e-5
    wrong_small = [big, torch.tensor([5e-9, 0.0]), None]  # 5e-7 of the largest gradient
    assert gradient_agreement(wrong_small, reference)[0] == "differ"
    wrong_big = [big * (1 + 2e-4), noise, None]
    assert gradient_agreement(wrong_big, reference)[0] == "differ"
    assert gradient_agreement([big, None, None], reference) == ("differ", None)


def test_garbage_of_an_earlier_step_does_not_lower_the_peak():
    """A cycle holding a tensor made under the profiler, collected during a later step, would
    lower the CPU allocator's running total there: the meter collects it before the step."""
    import gc

    class Cycle:
        pass

    def leave_garbage() -> None:
        node = Cycle()
        node.self = node
        node.tensor = torch.ones(1_000_000)  # 4 MB, freed only by the collector

    def step() -> None:
        first = torch.ones(2_000_000)  # 8 MB
        gc.collect()  # the collector runs during the step
        second = torch.ones(2_000_000)
        del first, second

    allocator_peak(leave_garbage, [], torch.device("cpu"))
    peak, _ = allocator_peak(step, [], torch.device("cpu"))
    assert abs(peak - 16_000_000) < 100_000, peak
