"""The budget holds through ``memplan.torch.enable`` in the loop a user writes (issue 35, item 2).

A plan installed by ``enable`` counts what the loop holds besides the activations (docs/model.md,
"The training loop"): the model's own loss or the caller's, the optimizer the loop steps (its state
and its step's temporaries, seen at its first step under ``optimizer="auto"``), the gradients
between steps, the output the caller keeps. Tiny GPT-2, Llama and BERT (transformers configs,
random weights), memplan's zoo ResNet-18 on 32x32 images and a model of one's own that returns a
dict train real steps with AdamW (PyTorch's default step and the fused one) at several budgets;
every step measures within the budget, and from the second step on (the loop seen, the plan
re-solved for it) the planned peak is the measured one within 2%.

The peaks are the allocator's own count (:func:`memplan.torch.measure.allocator_peak.allocator_peak`,
code apart from memplan's runtime and planner), with the weights, the optimizer's state, the
batch and what the caller held from the step before counted as resident at the start. Nothing
here states a byte count of this machine: budgets come from the model's own profile.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import build_model, enable, planned, profile_model  # noqa: E402
from memplan.torch.base.storage import distinct_bytes, tensors_of  # noqa: E402
from memplan.torch.measure.allocator_peak import loop_peaks  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

PLANNED = 0.02
"""Planned against measured, in both directions, once the loop is seen."""
STEPS = 3
VOCAB = 1000


# ------------------------------------------------------------------------------------------------
# The models and the loops their users write
# ------------------------------------------------------------------------------------------------


def _hf(kind: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
            eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    elif kind == "llama":
        config = transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0,
            pad_token_id=0,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.BertConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            vocab_size=VOCAB, max_position_embeddings=32, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        model = transformers.BertForMaskedLM(config)
    return model, _lm_batch(kind, 0)


def _lm_batch(kind: str, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, 32), generator=gen)
    labels = ids.clone()
    if kind == "bert":  # a masked LM predicts some positions
        labels[torch.rand(ids.shape, generator=gen) > 0.3] = -100
    return {"input_ids": ids, "labels": labels}


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(96, 192), nn.GELU(), nn.Linear(192, 96))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(h)


class _DictOutput(nn.Module):
    """A model of one's own: a stem, a run of repeated blocks, a head, and a dict as output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(48, 96), *(_Residual() for _ in range(4)))
        self.proj = nn.Linear(96, 64)
        self.cls = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.proj(self.body(x))
        return {"features": features, "logits": self.cls(features)}


def classifier_batch(shape: tuple[int, ...], classes: int, seed: int):
    """``(x, y)``: features of ``shape`` and a class of ``classes`` per row, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen), torch.randint(0, classes, (shape[0],), generator=gen)


def classifier_loss(m, b, kept):
    """The cross-entropy of ``m`` on a :func:`classifier_batch` (the output not kept)."""
    return F.cross_entropy(m(b[0]), b[1])


def fused_adamw(params):
    """Fused AdamW, the optimizer of the test files that train a block of their own."""
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-4, fused=True)


class StemBlocksHead(nn.Module):
    """A classifier of one's own around a block to try: a stem (32 features to ``width``),
    ``count`` blocks ``block()`` makes, a head to 10 classes; seeded, so that every instance
    starts from the same weights."""

    def __init__(self, block: Callable[[], nn.Module], count: int, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(32, width)
        self.blocks = nn.ModuleList(block() for _ in range(count))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


@functools.cache
def _case(kind: str):
    """``(model, example batch, profile, batch(seed), loss(model, batch, kept))``: the loss as
    its users compute it, ``kept`` what the caller holds until the next step."""
    if kind in ("gpt2", "llama", "bert"):
        model, batch = _hf(kind)

        def loss(m, b, kept):
            return m(**b).loss  # the model's own loss; the output is not kept

        make = functools.partial(_lm_batch, kind)
    elif kind == "resnet18":
        model, x, _ = build_model("resnet18", batch_size=4, input_shape=(3, 32, 32))
        batch = classifier_batch((4, 3, 32, 32), 1000, 0)

        def loss(m, b, kept):
            kept["out"] = m(b[0])  # the caller's loss; the output held until the next step
            return F.cross_entropy(kept["out"], b[1])

        def make(seed):
            return classifier_batch((4, 3, 32, 32), 1000, seed)
    else:
        model = _DictOutput()
        batch = classifier_batch((8, 48), 10, 0)

        def loss(m, b, kept):
            kept["out"] = m(b[0])
            return F.cross_entropy(kept["out"]["logits"], b[1]) + kept["out"]["features"].mean()

        def make(seed):
            return classifier_batch((8, 48), 10, seed)

    example = batch if isinstance(batch, dict) else batch[0]
    prof = profile_model(copy.deepcopy(model), example_input=example, repeats=1, name=kind)
    return model, example, prof, make, loss


def _storage_bytes(value) -> int:
    """Bytes of the distinct storages under ``value`` (a model's output)."""
    return distinct_bytes(tensors_of(value))


def budget_between(prof, share: float) -> int:
    """The budget ``share`` of the way from the least memory of ``prof`` to its store-all need,
    for a loop stepping fused AdamW with its gradients made at the backward.
    """
    desc = describe(prof, optimizer="adamw:fused", gradients="at-backward")
    least, top = desc["min_memory"]["chain"], desc["store_all_memory"]
    return least + int(share * (top - least))


def train_measured(model, optimizer, batches, loss, set_to_none=True) -> list[tuple[int, int]]:
    """The user's loop, each step measured (:func:`loop_peaks`, the allocator's count apart from
    memplan's runtime): ``[(planned, measured)]`` per step."""
    rows = loop_peaks(
        model, optimizer, batches, loss, set_to_none=set_to_none,
        after=lambda: planned(model).schedule.peak_memory,
    )  # fmt: skip
    return [(plan, measured) for measured, plan in rows]


def assert_rows_hold(rows, budget: int, planned: float | None = PLANNED) -> None:
    """Every step of ``rows`` (:func:`train_measured`) measured within ``budget``, and from the
    second step on (the loop seen at the first, the plan re-solved for it) the plan within
    ``planned`` of the measured peak (None: not checked)."""
    for i, (plan, measured) in enumerate(rows):
        assert measured <= budget, (i, measured, budget, plan)
        if i >= 1 and planned is not None:
            assert abs(plan - measured) <= planned * measured, (i, plan, measured)


def trained_plainly(model, batches, loss, make_optimizer):
    """A copy of ``model`` after plain training on ``batches``: PyTorch's loop,
    ``zero_grad(set_to_none=True)``, ``loss(model, batch, None).backward()``, the step of
    ``make_optimizer(parameters)``."""
    ref = copy.deepcopy(model)
    optimizer = make_optimizer(ref.parameters())
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        loss(ref, batch, None).backward()
        optimizer.step()
    return ref


def assert_same_parameters(ref, got, rtol=1e-4, atol=1e-5) -> None:
    """Every parameter of ``got`` is ``ref``'s, named where one differs."""
    for (name, a), (_, b) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def _stated_least(model, example, prof, optimizer="auto", output_held=None) -> int:
    """The least memory ``enable`` states when it refuses a budget of 0.01 MB: in MB, the unit
    the budget was typed in (rounded up), with the bytes."""
    with pytest.raises(InputError, match="the least memory that fits is") as caught:
        enable(
            copy.deepcopy(model), "0.01MB", example_input=example, profile=prof,
            optimizer=optimizer, output_held=output_held,
        )  # fmt: skip
    found = re.search(r"fits is ([\d.]+) MB \((\d+) bytes\)", str(caught.value))
    assert found, str(caught.value)
    exact = int(found.group(2)) / 1e6  # the short form rounded up: typed back, it fits
    assert exact <= float(found.group(1)) < exact + 0.01
    return int(found.group(2))


def _adamw(step: str):
    def make(params):
        return torch.optim.AdamW(params, lr=1e-3, **({"fused": True} if step == "fused" else {}))

    return make


# ------------------------------------------------------------------------------------------------
# The budget holds, and the plan is what is measured
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["default", "fused"])
@pytest.mark.parametrize("fraction", [0.0, 0.5])
@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert", "resnet18", "dict"])
def test_enable_keeps_its_budget_in_the_users_loop(kind, fraction, step):
    model, example, prof, make, loss = _case(kind)
    least = _stated_least(model, example, prof)
    top = memplan.solve(
        prof, "store-all", 2**50, optimizer="adamw:foreach", output_held=True
    ).peak_memory
    budget = least + int(fraction * max(0, top - least))
    got = enable(copy.deepcopy(model), budget, example_input=example, profile=prof)
    optimizer = _adamw(step)(got.parameters())
    rows = train_measured(got, optimizer, [make(s) for s in range(STEPS)], loss)
    assert_rows_hold(rows, budget)
    seen = planned(got).schedule.budget
    assert seen.optimizer == "adamw"
    assert seen.optimizer_step == ("fused" if step == "fused" else "for-loop")  # CPU default
    assert bool(seen.output_held) == (kind in ("resnet18", "dict"))


def test_an_sgd_loop_is_planned_for_sgd_after_its_first_step():
    """``auto`` planned for AdamW: seen SGD, the plan is re-solved with no optimizer state, a
    smaller static memory and a faster plan at the same budget."""
    model, example, prof, make, loss = _case("gpt2")
    budget = _stated_least(model, example, prof)
    got = enable(copy.deepcopy(model), budget, example_input=example, profile=prof)
    first = planned(got).schedule
    rows = train_measured(got, torch.optim.SGD(got.parameters(), lr=0.1), [make(0), make(1)], loss)
    after = planned(got).schedule
    assert after.budget.optimizer == "sgd" and first.budget.optimizer == "adamw"
    assert after.static_memory < first.static_memory
    assert after.makespan <= first.makespan
    assert all(measured <= budget for _, measured in rows)
    assert abs(rows[1][0] - rows[1][1]) <= PLANNED * rows[1][1]


def test_another_models_optimizer_does_not_make_the_plan_again():
    """Two models, two optimizers stepping in turn (a GAN, a benchmark of several ways): the
    plan is re-solved once, for the optimizer seen stepping the model under it, not at every
    step because another optimizer stepped in between."""
    model, example, prof, make, loss = _case("gpt2")
    budget = _stated_least(model, example, prof)
    got = enable(copy.deepcopy(model), budget, example_input=example, profile=prof)
    other = copy.deepcopy(model)
    mine = torch.optim.SGD(got.parameters(), lr=0.1)
    theirs = torch.optim.SGD(other.parameters(), lr=0.1)
    plans = []
    for seed in range(STEPS + 1):
        for m, opt in ((got, mine), (other, theirs)):
            opt.zero_grad(set_to_none=True)
            loss(m, make(seed), []).backward()
            opt.step()
        plans.append(planned(got).schedule)
    assert plans[1].budget.optimizer == "sgd"  # seen at the first step, planned at the second
    assert all(plan is plans[1] for plan in plans[2:])


def test_a_loop_that_keeps_its_gradients_is_planned_for_them():
    """``zero_grad(set_to_none=False)``: from the second step on the gradients are there when a
    step starts; the plan is re-solved for them (``kept``) before that step runs."""
    model, example, prof, make, loss = _case("llama")
    top = memplan.solve(prof, "store-all", 2**50, optimizer="adamw", gradients="kept").peak_memory
    got = enable(copy.deepcopy(model), top, example_input=example, profile=prof)
    optimizer = torch.optim.AdamW(got.parameters(), lr=1e-3)
    batches = [make(s) for s in range(STEPS)]
    rows = train_measured(got, optimizer, batches, loss, set_to_none=False)
    assert planned(got).schedule.budget.gradients == "kept"
    assert all(measured <= top for _, measured in rows)
    plan, measured = rows[-1]
    assert abs(plan - measured) <= PLANNED * measured, (plan, measured)


def test_a_language_model_whose_output_the_caller_keeps():
    """``out = model(**batch)`` in a loop keeps the logits until the next step: counted."""
    model, example, prof, make, _ = _case("gpt2")

    def loss(m, b, kept):
        kept["out"] = m(**b)
        return kept["out"].loss

    budget = _stated_least(model, example, prof)
    got = enable(copy.deepcopy(model), budget, example_input=example, profile=prof)
    rows = train_measured(
        got, torch.optim.AdamW(got.parameters()), [make(s) for s in range(3)], loss
    )
    assert planned(got).schedule.budget.output_held
    assert all(measured <= budget for _, measured in rows)
    assert abs(rows[-1][0] - rows[-1][1]) <= PLANNED * rows[-1][1]


# ------------------------------------------------------------------------------------------------
# The least memory stated is the least that trains (issue 40, item 4)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["resnet18", "dict"])
def test_the_least_memory_stated_is_the_least_that_trains(kind):
    """With the optimizer named and the output the loop keeps, ``enable`` at the least memory it
    states trains within it and measures within 2% of it; 3% below, it is refused."""
    model, example, prof, make, loss = _case(kind)
    kept_bytes = _output_bytes(model, example)
    named = {"optimizer": "adamw", "output_held": True}
    least = _stated_least(model, example, prof, **named)
    got = enable(copy.deepcopy(model), least, example_input=example, profile=prof, **named)
    rows = train_measured(
        got, torch.optim.AdamW(got.parameters()), [make(s) for s in range(3)], loss
    )
    for _, measured in rows:
        assert measured <= least, (measured, least)
    for _, measured in rows[1:]:  # the first step: the optimizer's state is not there yet
        assert measured >= least * (1 - PLANNED), (measured, least)
    assert planned(got).schedule.budget.output_bytes in (None, kept_bytes)
    below = f"{least * 0.97 / 1e6:.6f}MB"
    with pytest.raises(InputError, match=r"the least memory that fits is [\d.]+ MB \(\d+ bytes\)"):
        enable(copy.deepcopy(model), below, example_input=example, profile=prof, **named)


def _output_bytes(model, example) -> int:
    with torch.no_grad():
        return _storage_bytes(model(example))


def test_a_model_under_a_plan_is_collected_as_any_other():
    """The global optimizer-step hook of the loop's watch holds nothing alive."""
    import gc
    import weakref

    model, example, prof, _, _ = _case("dict")
    got = enable(copy.deepcopy(model), 10**9, example_input=example, profile=prof)
    gone = weakref.ref(got)
    del got
    gc.collect()
    assert gone() is None


# ------------------------------------------------------------------------------------------------
# The optimizer step in the backward (issue 35, item 5)
# ------------------------------------------------------------------------------------------------


class _Wide(nn.Module):
    """Wide layers on a small batch: the gradients, not the activations, set the least memory
    of PyTorch's loop (as they do for a language model with its loss in chunks)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(*(nn.Linear(256, 256) for _ in range(6)), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _wide_batch(seed: int):
    return classifier_batch((4, 256), 10, seed)


@pytest.mark.parametrize("step", ["default", "fused"])
def test_the_step_in_the_backward_trains_as_plain_training(step):
    """``gradients="step-in-backward"``: each parameter stepped by the loop's own AdamW as its
    gradient is made. The parameters after several steps on different batches are plain
    training's; the least memory is below PyTorch's loop's, and what is planned is measured."""
    model = _Wide()
    x, _ = _wide_batch(0)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="wide")
    ref, got = copy.deepcopy(model), copy.deepcopy(model)
    ref_opt, got_opt = _adamw(step)(ref.parameters()), _adamw(step)(got.parameters())
    kw = {"example_input": x, "profile": prof, "output_held": False}
    least = _stated_least(got, x, prof, optimizer=got_opt, output_held=False)
    refused = str(_refusal(model, got_opt, kw))
    assert "the gradients step-in-backward" in refused
    in_backward = int(re.search(r"\((\d+) bytes\)", refused).group(1))
    assert in_backward < least  # the gradients are never all there
    enable(got, in_backward, optimizer=got_opt, gradients="step-in-backward", **kw)
    batches = [_wide_batch(s) for s in range(1, 5)]
    rows = train_measured(got, got_opt, batches, classifier_loss)
    for batch in batches:
        ref_opt.zero_grad()
        classifier_loss(ref, batch, {}).backward()
        ref_opt.step()
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")
        assert q.grad is None  # stepped and freed in the backward
    assert planned(got).schedule.budget.gradients == "step-in-backward"
    assert_rows_hold(rows, in_backward)


def _refusal(model, optimizer, kw) -> InputError:
    with pytest.raises(InputError) as caught:
        enable(
            copy.deepcopy(model), "0.01MB", optimizer=optimizer, gradients="step-in-backward",
            **kw,
        )  # fmt: skip
    return caught.value


def test_a_refusal_names_the_step_in_the_backward_where_it_needs_less():
    """Below PyTorch's loop's least memory (every gradient held at the end of the backward), the
    refusal says the step in the backward fits, or what it needs; a user following it gets a
    plan. A loop that keeps its gradients (accumulation) is not told: it cannot step early."""
    model = _Wide()
    x, _ = _wide_batch(0)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="wide")
    opt = torch.optim.AdamW(model.parameters())
    kw = {"example_input": x, "profile": prof, "output_held": False}
    least = _stated_least(model, x, prof, optimizer=opt, output_held=False)
    in_backward = int(re.search(r"\((\d+) bytes\)", str(_refusal(model, opt, kw))).group(1))
    advice = "gradients='step-in-backward', optimizer=<the optimizer the loop steps>"
    for budget, says in (((least + in_backward) // 2, "fits"), (in_backward - 1, "needs less")):
        with pytest.raises(InputError) as caught:
            enable(copy.deepcopy(model), budget, optimizer=opt, **kw)
        message = " ".join(str(caught.value).split())
        assert message.endswith(advice) and f"as it is made, {says}" in message, message
        if says == "needs less":
            assert f"needs less, {in_backward} bytes" in message, message
    with pytest.raises(InputError) as caught:
        enable(copy.deepcopy(model), in_backward - 1, optimizer=opt, gradients="kept", **kw)
    assert "step-in-backward" not in str(caught.value)
    enable(model, (least + in_backward) // 2, optimizer=opt, gradients="step-in-backward", **kw)
    assert planned(model).schedule.budget.gradients == "step-in-backward"


def test_the_step_in_the_backward_refuses_an_accumulating_loop():
    model = _Wide()
    x, _ = _wide_batch(0)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="wide")
    opt = torch.optim.AdamW(model.parameters())
    enable(model, 10**9, example_input=x, profile=prof, optimizer=opt, gradients="step-in-backward")
    classifier_loss(
        model, _wide_batch(1), {}
    ).backward()  # a first micro-batch, no optimizer.step()
    with pytest.raises(InputError, match="gradient accumulation"):
        classifier_loss(model, _wide_batch(2), {})
    with pytest.raises(InputError, match="give it"):
        enable(_Wide(), 10**9, example_input=x, profile=prof, gradients="step-in-backward")


def test_fit_steps_in_the_backward_too():
    """The wrapped chain of ``fit`` takes the step in the backward as ``enable`` does."""
    from memplan.torch import fit

    model = _Wide()
    x, y = _wide_batch(0)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="wide")
    ref, got = copy.deepcopy(model), copy.deepcopy(model)
    ref_opt, got_opt = torch.optim.AdamW(ref.parameters()), torch.optim.AdamW(got.parameters())
    wrapped, sched = fit(
        got, x, memory=10**9, profile=prof, optimizer=got_opt, gradients="step-in-backward"
    )
    assert sched.budget.gradients == "step-in-backward"
    for s in range(1, 4):
        bx, by = _wide_batch(s)
        wrapped(bx, by).backward()
        got_opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(bx), by).backward()
        ref_opt.step()
    for p, q in zip(ref.parameters(), got.parameters(), strict=True):
        torch.testing.assert_close(q, p)


# ------------------------------------------------------------------------------------------------
# Weights outside every stage (NOTE [ weights outside every stage ])
# ------------------------------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(h)


class _WithTower(StemBlocksHead):
    """A model of one's own with a tower its batch never reaches (a multimodal model trained on
    text): larger than the rest, its parameters the largest, batch-norm buffers in it."""

    def __init__(self) -> None:
        super().__init__(_Block, 4)
        self.tower = nn.Sequential(nn.Linear(256, 512), nn.BatchNorm1d(512), nn.Linear(512, 256))


def _tower_batch(seed: int):
    return classifier_batch((16, 32), 10, seed)


@functools.cache
def _tower_profile():
    x, _ = _tower_batch(0)
    return profile_model(_WithTower(), example_input=x, repeats=1, name="tower")


def test_the_whole_batch_the_loop_holds_is_counted():
    """An attention mask the model turns into its own masks before the blocks stays in the
    loop's batch for the whole step: in the profile's ``input_size``, measured by
    ``profile_model`` and by ``enable``; a plan with it holds the measured step (tiny Llama's
    measured 1,020 bytes above its plan before)."""
    model, _ = _hf("llama")
    batch = _lm_batch("llama", 0)
    masked = {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
    mask_bytes = masked["attention_mask"].untyped_storage().nbytes()
    plain = profile_model(copy.deepcopy(model), example_input=batch, repeats=1)
    with_mask = profile_model(copy.deepcopy(model), example_input=masked, repeats=1)
    assert with_mask.input_size == plain.input_size + mask_bytes
    budget = budget_between(with_mask, 0.0)
    got = enable(copy.deepcopy(model), budget, example_input=masked, optimizer="adamw:fused",
                 output_held=False, repeats=1)  # fmt: skip
    assert planned(got).profile.input_size == with_mask.input_size
    batches = [
        {**_lm_batch("llama", s), "attention_mask": masked["attention_mask"]} for s in (1, 2, 3)
    ]
    optimizer = torch.optim.AdamW(got.parameters(), lr=1e-3, eps=1e-4, fused=True)
    rows = train_measured(got, optimizer, batches, lambda m, b, kept: m(**b).loss)
    for i, (plan, measured) in enumerate(rows[1:]):
        assert measured <= plan <= budget, (i, measured, plan, budget)


def test_the_profile_counts_the_weights_the_batch_never_reaches():
    """The tower is in no stage: its parameters and buffers are ``unreached_weight_size``, and
    the optimizer's order leaves its parameters out (they never have a gradient)."""
    model, prof = _WithTower(), _tower_profile()
    tower = [*model.tower.parameters(), *model.tower.buffers()]
    assert prof.unreached_weight_size == sum(t.numel() * t.element_size() for t in tower)
    reached = [p for name, p in model.named_parameters() if not name.startswith("tower.")]
    assert prof.parameter_sizes == [p.numel() * p.element_size() for p in reached]
    without = prof.model_copy(update={"unreached_weight_size": None})
    for loop in ("at-backward", "kept"):
        with_tower = memplan.solve(prof, "store-all", 2**40, optimizer="adamw", gradients=loop)
        alone = memplan.solve(without, "store-all", 2**40, optimizer="adamw", gradients=loop)
        assert with_tower.static_memory == alone.static_memory + prof.unreached_weight_size


@pytest.mark.parametrize("step", ["default", "foreach", "fused"])
def test_weights_the_batch_never_reaches_are_in_the_budget(step):
    """At the least memory ``enable`` states (AdamW and its step named, the output not kept) the
    model trains within it, the tower's weights included, and the plan is what is measured: the
    tower has no gradient, no state and no step temporaries (its parameters, the largest, would
    set a for-loop or foreach step's if they were counted)."""
    model, prof = _WithTower(), _tower_profile()
    x, _ = _tower_batch(0)
    name = "adamw" if step == "default" else f"adamw:{step}"
    named = {"optimizer": name, "output_held": False}
    least = _stated_least(model, x, prof, **named)
    got = enable(copy.deepcopy(model), least, example_input=x, profile=prof, **named)
    kind = {} if step == "default" else {step: True}
    optimizer = torch.optim.AdamW(got.parameters(), lr=1e-3, **kind)
    rows = train_measured(got, optimizer, [_tower_batch(s) for s in range(STEPS)], classifier_loss)
    assert all(p.grad is None for p in got.tower.parameters())
    assert_rows_hold(rows, least)
