"""memplan's memory is PyTorch's memory: on real CPU training steps in PyTorch's default loop
(``zero_grad()`` sets the gradients to None; docs/model.md, "The training loop"), the runtime's
store-all plan measures what plain training measures, and every plan's planned peak is its
measured one (store-all, a budget between, rotor's least memory).

Planned and measured figures come from the same run on the same machine
(:func:`memplan.torch.compare.training.compare_training`, the allocator's own count of one step, one
thread), so the expectations hold on any machine: no byte count of this CPU is written here.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from memplan.torch.compare.training import compare_training  # noqa: E402

pytestmark = pytest.mark.torch

SAME = 0.01
"""Store-all against plain training: within 1%."""
PLANNED = 0.02
"""Planned against measured, in both directions: within 2%."""

HF_MODELS = {
    "gpt2": ("hf:gpt2", "n_layer=2,n_embd=64,n_head=2,vocab_size=1000,n_positions=32"),
    "llama": (
        "hf:llama",
        "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=2,"
        "num_key_value_heads=2,vocab_size=1000",
    ),
    "bert": (
        "hf:bert",
        "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=2,"
        "vocab_size=1000,max_position_embeddings=32,attention_probs_dropout_prob=0.0,"
        "hidden_dropout_prob=0.0",
    ),
}


def _cnn() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    return model, torch.randn(8, 3, 32, 32)


def _compare(key: str, **kwargs):
    common = dict(rounds=1, segments=(), compile_budgets=(), at_alternatives=False, repeats=1)
    if key == "cnn":
        model, x = _cnn()
        return compare_training(model, example_input=x, **common, **kwargs)
    pytest.importorskip("transformers")
    name, config = HF_MODELS[key]
    return compare_training(
        name, config=config, batch_size=2, input_shape=(32,), **common, **kwargs
    )


def _close(planned: int, measured: int, tolerance: float) -> bool:
    return abs(planned - measured) <= tolerance * measured


@pytest.mark.parametrize("key", ["gpt2", "llama", "bert", "cnn"])
def test_planned_is_measured(key):
    """Also on recomputing plans where autograd frees a stage's input (the CNN's batch norm and
    ReLU: the runtime lets go of it as the model does) and where a tied embedding's gradient is
    summed out of place with the head's (BERT: NOTE [ a gradient a later stage made ])."""
    first = _compare(key)
    rows = {o.name: o for o in first.outcomes}
    plain, store_all = rows["plain"], rows["memplan store-all"]
    least = rows["memplan rotor (least memory)"]
    assert store_all.grads == "equal" and least.grads == "equal"
    assert _close(store_all.peak, plain.peak, SAME), (store_all.peak, plain.peak)
    for row in (store_all, least):
        assert _close(row.planned_peak, row.peak, PLANNED), (row.name, row.planned_peak, row.peak)
    # a budget between rotor's least memory and store-all's need: the plan recomputes
    between = (least.planned_peak + store_all.planned_peak) // 2
    second = _compare(key, profile=first.profile, algos=(), budgets=[between])
    mid = next(o for o in second.outcomes if o.setting == f"at {between} bytes")
    assert mid.skipped is None and mid.grads == "equal"
    assert mid.planned_peak <= between
    assert _close(mid.planned_peak, mid.peak, PLANNED), (mid.planned_peak, mid.peak)


def test_the_kept_loop_counts_the_gradients_for_the_whole_step():
    """A plan made for ``kept`` (zero_grad(set_to_none=False)) plans at least the default loop's
    peak: the gradients are counted from the start."""
    import memplan

    first = _compare("gpt2", algos=("store-all",))
    prof = first.profile
    fresh = memplan.solve(prof, "store-all", 2**40, gradients="at-backward")
    kept = memplan.solve(prof, "store-all", 2**40, gradients="kept")
    assert fresh.budget.gradients == "at-backward" and kept.budget.gradients == "kept"
    assert kept.peak_memory > fresh.peak_memory
    assert memplan.solve(prof, "store-all", 2**40).budget.gradients == "at-backward"  # auto
