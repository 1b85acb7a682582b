"""memplan.torch.runtime.planned: a model trains under a plan in the user's own loop, called as before.

Every case trains several steps on different batches (other labels, a smaller last batch,
shorter sequences, padding) under a plan that recomputes, next to plain training of an identical
copy, and compares every parameter after the steps (and the buffers: batch-norm statistics).
The models are tiny (a few layers, width 32-64, batch 2-4); the plans are rotor's at budgets
that force recomputation (a quarter of the way from its least memory to the store-all need) or
hand-written ones for the cases a budget does not pin (the head recomputed).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe, schedule_from_sequence  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import build_model, enable, planned, profile_model  # noqa: E402
from memplan.torch.runtime.planned import apply_plan, disable  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 100


def _budget(prof, fraction: float = 0.25) -> int:
    """A budget of SGD's plans, from the least memory to store-all's, for a loop that keeps
    nothing of the model's output (these tests' loops: ``enable(..., output_held=False)``)."""
    least = memplan.solve(prof, "rotor", 1, optimizer="sgd", output_held=False).min_memory
    store_all = memplan.solve(
        prof, "store-all", 2**50, optimizer="sgd", output_held=False
    ).peak_memory
    return least + int((store_all - least) * fraction)


def _sgd_plan(model, x, prof, fraction: float = 0.25, **more):
    """``enable`` on a copy of ``model`` in train mode, for the loops of these tests: SGD, the
    output not kept, at :func:`_budget`."""
    return enable(
        copy.deepcopy(model).train(), _budget(prof, fraction), example_input=x, profile=prof,
        optimizer="sgd", output_held=False, **more,
    )  # fmt: skip


def _assert_same(ref: nn.Module, got: nn.Module, rtol: float | None = None, atol=None) -> None:
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
    for (name, p), (_, q) in zip(ref.named_buffers(), got.named_buffers(), strict=True):
        torch.testing.assert_close(q, p, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def _train(models, batches, step, lr: float = 0.1) -> list[list[float]]:
    """SGD on every model, the same batches, the same RNG seed per step; the losses."""
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m in models]
    losses: list[list[float]] = [[] for _ in models]
    for i, batch in enumerate(batches):
        for j, (model, opt) in enumerate(zip(models, optimizers, strict=True)):
            opt.zero_grad()
            torch.manual_seed(100 + i)
            loss = step(model, batch)
            loss.backward()
            opt.step()
            losses[j].append(loss.item())
    return losses


# ------------------------------------------------------------------------------------------------
# Hugging Face: the model's own loss from each batch's labels, padding, any smaller batch
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=3, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, VOCAB, (4, 16))
    prof = profile_model(copy.deepcopy(model), example_input=ids, repeats=1, name="gpt2-tiny")
    return model, ids, prof


def _hf_batches() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    batches = []
    for batch, seq in ((4, 16), (4, 12), (3, 9)):  # a smaller last batch, shorter sequences
        ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
        mask = torch.ones_like(ids)
        mask[0, -3:] = 0  # padding
        labels = torch.randint(0, VOCAB, (batch, seq), generator=gen)  # not the inputs
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def _hf_step(model, batch):
    return model(**batch).loss


@pytest.mark.parametrize("fraction", [0.0, 0.25])
def test_hf_model_trains_on_each_batch_like_plain(gpt2, fraction):
    model, ids, prof = gpt2
    assert model.lm_head.weight is model.transformer.wte.weight  # tied across stages
    ref = copy.deepcopy(model).train()
    ref.config.use_cache = False  # as enable sets it: no KV cache in training
    got = _sgd_plan(model, {"input_ids": ids, "labels": ids}, prof, fraction)
    plan = planned(got)
    assert plan is not None and plan.how == "hooks"
    counts = plan.planned_forward_counts()
    assert sum(counts) > len(counts), "the budget forces recomputation"
    ref_losses, losses = _train([ref, got], _hf_batches(), _hf_step)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    _assert_same(ref, got)
    c = plan.counters
    assert [c.forward_count(k) for k in range(len(counts))] == counts
    assert c.backwards == [1] * len(counts)


def test_hf_head_and_embedding_recomputed(gpt2):
    """A hand-written plan that recomputes the part before the first block and the head (a
    budget does not pin these on a 3-block model): the head's module calls are replayed."""
    model, ids, prof = gpt2
    L = prof.length  # embedding, h.0, h.1, h.2, head, loss
    ops = [("F_ck", 0), ("F_n", 1), ("F_ck", 2), ("F_n", 3), ("F_n", 4), ("F_all", 5), ("B", 5)]
    ops += [("F_ck", 2), ("F_ck", 3), ("F_all", 4), ("B", 4), ("F_all", 3), ("B", 3)]
    ops += [("F_all", 2), ("B", 2)]
    ops += [("F_ck", 0), ("F_all", 1), ("B", 1), ("F_all", 0), ("B", 0)]
    sched = schedule_from_sequence(prof, ops)
    assert memplan.simulate(prof, sched).valid
    ref = copy.deepcopy(model).train()
    ref.config.use_cache = False
    got = apply_plan(copy.deepcopy(model).train(), sched, prof, {"input_ids": ids})
    _train([ref, got], _hf_batches(), _hf_step)
    _assert_same(ref, got)
    assert [planned(got).counters.forward_count(k) for k in range(L)] == [3, 2, 3, 3, 2, 1]


def test_larger_batch_is_refused_and_disable_restores(gpt2):
    model, ids, prof = gpt2
    got = _sgd_plan(model, ids, prof)
    with pytest.raises(InputError, match=r"\[4, 16\]"):
        got(input_ids=torch.randint(0, VOCAB, (4, 20)), labels=None)
    with pytest.raises(InputError, match="larger batch"):
        got(input_ids=torch.randint(0, VOCAB, (5, 16)))
    with torch.no_grad():  # evaluation: plain, any size
        got(input_ids=torch.randint(0, VOCAB, (8, 20)))
    disable(got)
    assert planned(got) is None and not got._forward_hooks and not got._forward_pre_hooks
    got(input_ids=torch.randint(0, VOCAB, (5, 16)), labels=ids.new_zeros(5, 16)).loss.backward()


def test_hf_gradient_accumulation(gpt2):
    """Two micro-batches per optimizer step: each forward/backward is one iteration of the plan."""
    model, ids, prof = gpt2
    ref = copy.deepcopy(model).train()
    ref.config.use_cache = False
    got = _sgd_plan(model, ids, prof)
    batches = _hf_batches()
    for m in (ref, got):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(2):
            opt.zero_grad()
            for micro in range(2):
                torch.manual_seed(10 * step + micro)
                (_hf_step(m, batches[step + micro]) / 2).backward()
            opt.step()
    _assert_same(ref, got)


# ------------------------------------------------------------------------------------------------
# The chain in place of forward: the user's criterion and labels, in-place ops, batch norm
# ------------------------------------------------------------------------------------------------


def _classifier_batches(width: int, classes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    sizes = (8, 8, 5)  # a smaller last batch
    return [
        (torch.randn(n, width, generator=gen), torch.randint(0, classes, (n,), generator=gen))
        for n in sizes
    ]


def _criterion_step(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _mlp(inplace: bool) -> nn.Sequential:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(inplace=inplace), nn.Linear(32, 32), nn.BatchNorm1d(32),
        nn.ReLU(inplace=inplace), nn.Dropout(0.2), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5),
    )  # fmt: skip


@pytest.mark.parametrize("fraction", [0.0, 0.3, 2.0])
def test_inplace_relu_at_stage_boundaries(fraction):
    """``nn.ReLU(inplace=True)`` as a stage of its own modifies the previous stage's output:
    every budget trains as plain training does (store-all included), batch norm's statistics
    updated once per step, dropout drawing the same masks."""
    model = _mlp(inplace=True)
    x = torch.randn(8, 16)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="mlp")
    ref = copy.deepcopy(model).train()
    got = _sgd_plan(model, x, prof, fraction)
    plan = planned(got)
    assert plan.how == "stages" and any(plan.inplace)
    if fraction < 1:
        assert sum(plan.planned_forward_counts()) > prof.length
    _train([ref, got], _classifier_batches(16, 5), _criterion_step)
    _assert_same(ref, got)


class _DictOutput(nn.Module):
    """Repeated blocks, then a projection and a classifier; a dict whose first entry is not the
    logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.stem = nn.Linear(12, 32)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU()) for _ in range(4)
        )
        self.proj = nn.Linear(32, 16)
        self.cls = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        features = self.proj(h)
        return {"features": features, "logits": self.cls(features)}


def test_dict_output_trains_its_classifier():
    model = _DictOutput()
    x = torch.randn(8, 12)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="dict")
    assert prof.stages[-2].name == "head"
    ref = copy.deepcopy(model).train()
    got = _sgd_plan(model, x, prof, 0.0)
    assert planned(got).how == "hooks"

    def step(model, batch):
        out = model(batch[0])
        return nn.functional.cross_entropy(out["logits"], batch[1]) + out["features"].mean()

    _train([ref, got], _classifier_batches(12, 4), step)
    assert got.cls.weight.grad is not None
    _assert_same(ref, got)


def test_builtin_resnet_with_its_own_labels():
    model, x, _ = build_model("resnet18", batch_size=2, input_shape=(3, 32, 32))
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="resnet18")
    ref = copy.deepcopy(model).train()
    got = _sgd_plan(model, x, prof)
    gen = torch.Generator().manual_seed(4)
    batches = [
        (torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, 1000, (n,), generator=gen))
        for n in (2, 2, 1 + 1)
    ]
    _train([ref, got], batches, _criterion_step, lr=0.01)
    _assert_same(ref, got)


# ------------------------------------------------------------------------------------------------
# Mixed precision
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_with_grad_scaler(gpt2, dtype):
    """The plan is profiled and trained under ``torch.autocast`` (CPU); fp16 with a GradScaler.
    Recomputations run under the autocast state of the first forward: the same values."""
    model, ids, _ = gpt2
    ref = copy.deepcopy(model).train()
    ref.config.use_cache = False
    with torch.autocast("cpu", dtype=dtype):
        prof = profile_model(copy.deepcopy(model), example_input=ids, repeats=1, name="amp")
        got = _sgd_plan(model, ids, prof, 0.0)
    assert sum(planned(got).planned_forward_counts()) > prof.length
    for m in (ref, got):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
        for i, batch in enumerate(_hf_batches()):
            opt.zero_grad()
            torch.manual_seed(i)
            with torch.autocast("cpu", dtype=dtype):
                loss = _hf_step(m, batch)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    _assert_same(ref, got)


# ------------------------------------------------------------------------------------------------
# What is not a chain
# ------------------------------------------------------------------------------------------------


class _UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()

        def conv(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())  # fmt: skip

        self.enc1, self.enc2, self.enc3 = conv(3, 8), conv(8, 16), conv(16, 32)
        self.pool = nn.MaxPool2d(2)
        self.up2, self.dec2 = nn.ConvTranspose2d(32, 16, 2, stride=2), conv(32, 16)
        self.up1, self.dec1 = nn.ConvTranspose2d(16, 8, 2, stride=2), conv(16, 8)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        e3 = self.enc3(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(e3), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.out(d1)


def test_unet_is_refused():
    with pytest.raises(InputError, match="not a chain"):
        enable(_UNet(), "1GB", example_input=torch.randn(2, 3, 16, 16))


def test_an_encoder_decoder_that_needs_decoder_inputs_is_refused():
    """T5 makes no decoder input from the input ids (BART does: it trains, test_model_sweep)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16,
                                   vocab_size=VOCAB)  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config)
    with pytest.raises(InputError, match="an encoder-decoder whose forward needs decoder inputs"):
        enable(model, "1GB", example_input=torch.randint(0, VOCAB, (2, 8)))


def test_hf_gradient_checkpointing_is_refused(gpt2):
    model, ids, prof = gpt2
    other = copy.deepcopy(model)
    other.gradient_checkpointing_enable()
    with pytest.raises(InputError, match="gradient checkpointing"):
        enable(other, "1GB", example_input=ids, profile=prof)


def test_chain_api_takes_each_batch_labels(gpt2):
    """``fit``/``checkpointed`` (the chain with its loss stage): ``wrapped(x, labels)`` trains on
    the batch's labels, and a language model fitted without labels predicts the tokens of the
    batch it is called on (not the example's)."""
    from memplan.torch import fit

    model, ids, prof = gpt2
    ref = copy.deepcopy(model).eval()
    wrapped, _ = fit(
        copy.deepcopy(model).eval(),
        ids,
        memory=_budget(prof),
        profile=prof,
        optimizer="sgd",
    )
    other = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(9))
    labels = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(8))
    with torch.enable_grad():
        own = ref(input_ids=other, labels=other).loss
        assert wrapped(other).item() == pytest.approx(own.item(), rel=1e-6)
        given = ref(input_ids=other, labels=labels).loss
        assert wrapped(other, labels).item() == pytest.approx(given.item(), rel=1e-6)
    model2 = _mlp(inplace=False).eval()
    x, y = torch.randn(8, 16), torch.randint(0, 5, (8,))
    prof2 = profile_model(copy.deepcopy(model2), example_input=x, repeats=1, name="mlp")
    wrapped2, _ = fit(model2, x, memory=_budget(prof2), profile=prof2, optimizer="sgd")
    loss = wrapped2(x, y)
    assert loss.item() == pytest.approx(nn.functional.cross_entropy(model2(x), y).item(), 1e-6)
    loss.backward()


def test_autocast_other_than_profiled_warns():
    model = _mlp(inplace=False)
    x = torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = enable(model, "1GB", example_input=x, repeats=1)
    assert planned(got).profile.measured.extra["autocast"] == "cpu:bfloat16"
    with pytest.warns(UserWarning, match="profiled with autocast cpu:bfloat16"):
        got(x).sum().backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got(x).float().sum().backward()  # as profiled


def _hf_family(which: str):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    small = {"num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 64}
    if which == "vit":
        config = transformers.ViTConfig(hidden_size=32, image_size=16, patch_size=4, num_labels=5,
                                        **small)  # fmt: skip
        model = transformers.ViTForImageClassification(config)

        def batch(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
            return {"pixel_values": torch.randn(n, 3, 16, 16, generator=gen),
                    "labels": torch.randint(0, 5, (n,), generator=gen)}  # fmt: skip

        return model, batch
    if which == "llama":
        config = transformers.LlamaConfig(hidden_size=32, num_key_value_heads=1, vocab_size=VOCAB,
                                          max_position_embeddings=64, **small)  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.BertConfig(hidden_size=32, vocab_size=VOCAB,
                                         max_position_embeddings=64, **small)  # fmt: skip
        model = transformers.BertForMaskedLM(config)

    def batch(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (n, 16), generator=gen)
        return {"input_ids": ids, "labels": torch.randint(0, VOCAB, (n, 16), generator=gen)}

    return model, batch


@pytest.mark.parametrize("which", ["vit", "llama", "bert"])
def test_hf_families_with_every_stage_recomputed(which):
    """ViT (its head reads the class token, a view: replayed), Llama (rotary embeddings), BERT
    (masked LM): a plan that recomputes every stage but the loss, including the part before the
    first block and the head, trains as plain training on three batches, the last one smaller."""
    model, batch = _hf_family(which)
    example = batch(4, torch.Generator().manual_seed(1))
    main = example.get("input_ids", example.get("pixel_values"))
    prof = profile_model(copy.deepcopy(model), example_input=main, repeats=1, name=which)
    L = prof.length
    ops = [("F_ck", 0)] + [("F_n", k) for k in range(1, L - 1)] + [("F_all", L - 1), ("B", L - 1)]
    for k in range(L - 2, 0, -1):
        ops += [("F_ck", 0)] + [("F_n", j) for j in range(1, k)] + [("F_all", k), ("B", k)]
    ops += [("F_all", 0), ("B", 0)]
    sched = schedule_from_sequence(prof, ops)
    assert memplan.simulate(prof, sched).valid
    ref = copy.deepcopy(model).train()
    ref.config.use_cache = False
    got = apply_plan(copy.deepcopy(model).train(), sched, prof, example)
    gen = torch.Generator().manual_seed(2)
    _train([ref, got], [batch(n, gen) for n in (4, 4, 3)], _hf_step)
    _assert_same(ref, got)
    counts = [planned(got).counters.forward_count(k) for k in range(L)]
    assert counts == [L, *range(L - 1, 0, -1)]


@pytest.mark.parametrize("algo", ["dynprog", "pofo"])
def test_hf_offloading_plans(gpt2, algo):
    """Offloading (dynprog) and offloading with recomputation (pofo) under enable: the saved
    tensors autograd holds for a stage are moved to host memory and back at the plan's points
    (the profile's sizes with fixed times and a link fast enough for offloading to pay, so that
    the plans do offload)."""
    model, ids, prof = gpt2
    data = prof.model_dump(exclude_none=True)
    data["bandwidth"] = 3e8
    for stage in data["stages"]:
        stage.update(forward_time=1.0, backward_time=2.0)
    timed = memplan.load_profile(data)
    desc = describe(timed)
    least = desc["min_memory"]["offload"]
    memory = least + (desc["store_all_memory"] - least) // 10
    ref = copy.deepcopy(model).train()
    ref.config.use_cache = False
    got = enable(copy.deepcopy(model).train(), memory, example_input=ids, profile=timed,
                 optimizer="sgd", output_held=False, algo=algo, slots=500)  # fmt: skip
    sched = planned(got).schedule
    assert sched.count("offload") >= 1
    _train([ref, got], _hf_batches(), _hf_step)
    _assert_same(ref, got)
    c = planned(got).counters
    assert c.offloaded_bytes == c.prefetched_bytes > 0
