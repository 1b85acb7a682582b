"""A tied gradient summed in place under a chunked loss (NOTE [ The tied gradient summed in place ]
in memplan/torch/split/tied_lookup.py): GPT-2's head and loss write their half of the token
embedding's gradient into ``.grad``, the token lookup adds its rows into it sparsely.

Several SGD and AdamW steps on different batches under ``enable(..., loss_chunks=N)`` give plain
training's parameters, ``.grad`` is plain training's dense gradient (``clip_grad_norm_`` finds
its norm), a loop that keeps its gradients takes today's way (counted), the profile counts the sum
in place (the embedding's backward no longer holds a second copy of the matrix) and the plan with
the step in the backward measures what it plans.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.torch import disable, enable, planned, profile_model  # noqa: E402
from memplan.torch.measure.allocator_peak import allocator_peak, profiled_copy  # noqa: E402
from memplan.torch.split import chunked_loss  # noqa: E402
from memplan.torch.split.tied_lookup import (  # noqa: E402
    TiedLookups,
    mark_tied_half,
    sparse_lookups,
)

pytestmark = pytest.mark.torch

VOCAB, WIDTH, SEQ, CHUNKS = 1024, 32, 32, 4


def _gpt2() -> nn.Module:
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=WIDTH, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).train()
    model.config.use_cache = False
    return model


def _batches(count: int = 3) -> list[dict]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for _ in range(count):
        ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
        out.append({"input_ids": ids, "labels": torch.randint(0, VOCAB, ids.shape, generator=gen)})
    return out


def _optimizer(kind: str, params) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-4)  # eps: see test_enable_chunked._train


def _enabled(model: nn.Module, memory="1GB", **kw) -> nn.Module:
    return enable(
        model, memory, example_input=_batches(1)[0], loss_chunks=CHUNKS, repeats=1, algo="rotor",
        **kw,
    )  # fmt: skip


def _assert_same(ref: nn.Module, got: nn.Module) -> None:
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_the_tied_gradient_is_plain_trainings_dense_gradient(kind):
    """Fresh gradients each step: the head writes its half, the lookup adds its rows; ``.grad``
    is dense and plain training's (clipped alike), the parameters after the steps too."""
    model = _gpt2()
    ref, got = copy.deepcopy(model), _enabled(copy.deepcopy(model), optimizer=kind)
    # the least memory: recomputation, the lookup and the chunked loss as the plan runs them
    prof = planned(got).profile
    got = _enabled(got, _least(prof, kind), profile=prof, optimizer=kind, output_held=False)
    chunked = planned(got).chunked
    assert "forward" in vars(got.transformer.wte)  # the sparse lookup
    optimizers = [_optimizer(kind, m.parameters()) for m in (ref, got)]
    for i, batch in enumerate(_batches()):
        norms = []
        for model_, opt in zip((ref, got), optimizers, strict=True):
            opt.zero_grad()
            torch.manual_seed(i)
            model_(**batch).loss.backward()
            norms.append(float(nn.utils.clip_grad_norm_(model_.parameters(), 0.5)))
        tied = got.transformer.wte.weight.grad
        assert tied.layout == torch.strided and not hasattr(tied, "_memplan_tied_half")
        torch.testing.assert_close(tied, ref.transformer.wte.weight.grad, rtol=1e-4, atol=1e-6)
        assert norms[1] == pytest.approx(norms[0], rel=1e-4)
        for opt in optimizers:
            opt.step()
    _assert_same(ref, got)
    assert (chunked.tied_into_grad, chunked.tied_returned) == (3, 0)


def _least(prof, optimizer: str, gradients: str = "auto") -> int:
    return memplan.solve(
        prof, "rotor", 1, optimizer=optimizer, output_held=False, gradients=gradients
    ).min_memory


@pytest.mark.parametrize("set_to_none", [False, True])
def test_a_loop_that_keeps_its_gradients_takes_todays_way(set_to_none):
    """``zero_grad(set_to_none=False)``, or two micro-batches per step: ``.grad`` exists at the
    head's backward, which returns its half (counted); the parameters are plain training's."""
    model = _gpt2()
    ref, got = copy.deepcopy(model), _enabled(copy.deepcopy(model), optimizer="sgd")
    chunked = planned(got).chunked
    optimizers = [_optimizer("sgd", m.parameters()) for m in (ref, got)]
    batches = _batches(4)
    for step in range(2):
        for model_, opt in zip((ref, got), optimizers, strict=True):
            opt.zero_grad(set_to_none=set_to_none)
            for batch in batches[2 * step : 2 * step + 2]:  # accumulated over two
                model_(**batch).loss.backward()
            assert model_.transformer.wte.weight.grad.layout == torch.strided
            opt.step()
    _assert_same(ref, got)
    # the first backward of a step finds no gradient where the loop sets them to None
    written = 2 if set_to_none else 1
    assert (chunked.tied_into_grad, chunked.tied_returned) == (written, 4 - written)


def test_the_step_in_the_backward_plans_what_it_measures():
    """``gradients="step-in-backward"`` at its least memory: plain training's parameters, and the
    allocator's peak within 2% of the plan's."""
    model = _gpt2()
    ref, got = copy.deepcopy(model), copy.deepcopy(model)
    prof = planned(_enabled(copy.deepcopy(model), optimizer="sgd")).profile
    ref_opt, got_opt = _optimizer("sgd", ref.parameters()), _optimizer("sgd", got.parameters())
    least = _least(prof, "sgd", "step-in-backward")
    _enabled(got, least, profile=prof, optimizer=got_opt, gradients="step-in-backward",
             output_held=False)  # fmt: skip
    batches = _batches()

    def step(batch: dict) -> None:
        got(**batch).loss.backward()
        got_opt.step()
        got_opt.zero_grad()

    held = [*got.parameters(), *got.buffers()]
    cpu = torch.device("cpu")
    for i, batch in enumerate(batches):
        ids = profiled_copy(batch["input_ids"])
        run = {**batch, "input_ids": ids}
        peak = allocator_peak(lambda b=run: step(b), [*held, *run.values()], cpu)[0]
        if i >= 1:  # the first step made the optimizer's state
            plan = planned(got).schedule.peak_memory
            assert peak <= least and abs(plan - peak) <= 0.02 * peak, (i, plan, peak, least)
        ref_opt.zero_grad()
        ref(**batch).loss.backward()
        ref_opt.step()
    _assert_same(ref, got)
    assert planned(got).chunked.tied_into_grad == len(batches)


def test_the_profile_counts_the_sum_in_place(monkeypatch):
    """The embedding's backward holds no second copy of the tied matrix: its measured overhead
    drops by about the matrix against the dense lookup's (the lookups not replaced)."""
    size = VOCAB * WIDTH * 4
    fresh = {}
    for sparse in (True, False):
        if not sparse:
            monkeypatch.setattr(chunked_loss, "sparse_lookups", lambda *a: TiedLookups([]))
        model = _gpt2()
        prof = profile_model(
            model, example_input=_batches(1)[0]["input_ids"], repeats=1, loss_chunks=CHUNKS,
            name="gpt2",
        )  # fmt: skip
        assert "forward" not in vars(model.transformer.wte)  # given back after profiling
        fresh[sparse] = prof.stages[0].backward_overhead_fresh
    assert fresh[False] - fresh[True] >= size - 2 * SEQ * WIDTH * 4 * 4, fresh


def test_autograd_grad_returns_the_whole_dense_gradient():
    """``torch.autograd.grad`` under the plan: both halves returned, dense, ``.grad`` untouched."""
    model = _gpt2()
    ref, got = copy.deepcopy(model), _enabled(copy.deepcopy(model), optimizer="sgd")
    batch = _batches(1)[0]
    found = []
    for model_ in (ref, got):
        torch.manual_seed(0)
        weight = model_.transformer.wte.weight
        (grad,) = torch.autograd.grad(model_(**batch).loss, [weight])
        assert grad.layout == torch.strided and weight.grad is None
        found.append(grad)
    torch.testing.assert_close(found[1], found[0], rtol=1e-4, atol=1e-6)
    chunked = planned(got).chunked
    assert (chunked.tied_into_grad, chunked.tied_returned) == (0, 1)


def test_disable_gives_the_lookup_back():
    got = _enabled(_gpt2(), optimizer="sgd")
    assert "forward" in vars(got.transformer.wte)
    disable(got)
    assert "forward" not in vars(got.transformer.wte)


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_the_sparse_lookup_adds_what_the_dense_one_does(padding_idx):
    """With a marked dense ``.grad``, the lookup's rows are added into it (the padding row
    none); without one, its gradient is the dense one, as ``nn.Embedding``'s."""
    torch.manual_seed(0)
    emb = nn.Embedding(16, 4, padding_idx=padding_idx)
    ref = copy.deepcopy(emb)
    ids = torch.tensor([[1, 3, 3, 7], [0, 15, 3, 1]])
    weights = torch.randn(2, 4, 4)
    lookups = sparse_lookups([emb], {id(emb.weight)})
    assert len(lookups) == 1
    for marked in (True, False):
        emb.weight.grad = None
        ref.weight.grad = torch.ones_like(ref.weight) if marked else None
        if marked:
            emb.weight.grad = torch.ones_like(emb.weight)
            mark_tied_half(emb.weight.grad)
        (emb(ids) * weights).sum().backward()
        (ref(ids) * weights).sum().backward()
        assert emb.weight.grad.layout == torch.strided
        torch.testing.assert_close(emb.weight.grad, ref.weight.grad)
    lookups.remove()
    assert "forward" not in vars(emb)
