"""``enable(..., loss_chunks=N or "auto")``: a Hugging Face language model's head and own loss in
chunks of tokens, in the user's loop and in ``transformers.Trainer``.

Every case trains several AdamW steps on different batches (other labels, a smaller last batch,
shorter sequences, padding) under a plan with the chunked loss, next to plain training of an
identical copy with the same random draws, and compares the losses and every parameter after
the steps. The models are tiny (2 layers, 32 wide, a vocabulary of 512: the logits are 16
times the hidden states, as on real language models).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import enable, planned  # noqa: E402
from memplan.torch.measure.allocator_peak import allocator_peak, profiled_copy  # noqa: E402
from memplan.torch.planner import CHUNKED_OUTPUT_BYTES  # noqa: E402
from memplan.torch.split.chunked_loss import CHUNKED_STAGE, auto_loss_chunks  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB, WIDTH, SEQ = 512, 32, 32


def _model(kind: str) -> nn.Module:
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=WIDTH, n_head=2, vocab_size=VOCAB, n_positions=SEQ
        )
        return transformers.GPT2LMHeadModel(config)  # tied head and embedding
    if kind == "llama":
        config = transformers.LlamaConfig(
            hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
            max_position_embeddings=SEQ,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config)  # an untied head
    config = transformers.BertConfig(
        hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=2,
        num_attention_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
    )  # fmt: skip
    return transformers.BertForMaskedLM(config)


def _batch(kind: str, gen: torch.Generator, size: int = 2, seq: int = SEQ) -> dict:
    ids = torch.randint(0, VOCAB, (size, seq), generator=gen)
    mask = torch.ones_like(ids)
    if kind == "bert":
        picked = torch.rand(ids.shape, generator=gen) < 0.3
        labels = torch.where(picked, torch.randint(0, VOCAB, ids.shape, generator=gen), -100)
    else:
        labels = torch.randint(0, VOCAB, ids.shape, generator=gen)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _batches(kind: str) -> list[dict]:
    gen = torch.Generator().manual_seed(7)
    batches = [_batch(kind, gen), _batch(kind, gen, 2, SEQ - 8), _batch(kind, gen, 1, SEQ)]
    batches[1]["attention_mask"][0, -3:] = 0  # padding
    return batches


def _train(models: list[nn.Module], batches: list[dict]) -> list[list[float]]:
    # The chunks sum the loss's gradients in another order: float noise (about 1e-7 of a tensor's
    # largest gradient), which the first step's gradients show as they are. Adam's step divides
    # by |g| + eps, so a gradient near eps turns that noise into up to lr / (4 eps) times it: at
    # lr 1e-2 and eps 1e-4, below 1e-6 per step; at eps 1e-6 (2 threads, generic kernels) 1.3e-5
    # after three steps on one element of GPT-2's tied embedding, above the parameters' atol.
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-4) for m in models]
    losses: list[list[float]] = [[] for _ in models]
    for i, batch in enumerate(batches):
        for j, (model, opt) in enumerate(zip(models, optimizers, strict=True)):
            opt.zero_grad()
            torch.manual_seed(100 + i)
            out = model(**batch)
            out.loss.backward()
            if i == 0 and j > 0:
                _assert_same_gradients(models[0], model)
            opt.step()
            losses[j].append(out.loss.item())
            assert (out.logits is None) == (j > 0)  # the chunked model returns no logits
    return losses


def _assert_same_gradients(ref: nn.Module, got: nn.Module) -> None:
    """Every gradient equal up to float noise: relative to its tensor's largest element, or to
    the model's largest where a gradient is zero in exact arithmetic (an attention's key bias).
    """
    pairs = list(zip(ref.named_parameters(), got.named_parameters(), strict=True))
    largest = max(p.grad.abs().max().item() for (_, p), _ in pairs if p.grad is not None)
    for (name, p), (_, q) in pairs:
        if p.grad is None:
            assert q.grad is None, name
            continue
        atol = 1e-5 * p.grad.abs().max().item() + 1e-7 * largest
        torch.testing.assert_close(
            q.grad, p.grad, rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


def _assert_same(ref: nn.Module, got: nn.Module) -> None:
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def _least(prof, optimizer: str = "adam", output_held: bool | int = CHUNKED_OUTPUT_BYTES) -> int:
    """rotor's least memory for this profile (its infeasible answer says it), for a loop that
    holds the output (a chunked loss's: its loss) until its next step, as :func:`_train` does.
    """
    return memplan.solve(prof, "rotor", 1, optimizer=optimizer, output_held=output_held).min_memory


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
def test_the_chunked_loss_trains_as_plain_training(kind):
    model = _model(kind)
    example = _batches(kind)[0]
    ref = copy.deepcopy(model).train()
    ref.config.use_cache = False
    got = enable(
        copy.deepcopy(model).train(), "1GB", example_input=example, loss_chunks=4, repeats=1,
        algo="rotor", optimizer="adam",
    )  # fmt: skip
    plan = planned(got)
    assert plan.names[-1] == CHUNKED_STAGE
    assert plan.profile.measured.extra["loss_chunks"] == 4
    got = enable(
        got, _least(plan.profile), example_input=example, loss_chunks=4, profile=plan.profile,
        optimizer="adam",
    )  # fmt: skip
    counts = planned(got).planned_forward_counts()
    assert sum(counts) > len(counts), "the least memory recomputes"
    ref_losses, losses = _train([ref, got], _batches(kind))
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    _assert_same(ref, got)
    with torch.no_grad():  # evaluation: plainly, logits and all
        out = got(**example)
    assert out.logits is not None and out.logits.shape == (2, SEQ, VOCAB)


def test_auto_picks_the_fewest_chunks_no_larger_than_what_the_stage_holds():
    # one chunk's logits no larger than the head's weight gradient or the hidden states'
    assert auto_loss_chunks(VOCAB, WIDTH, 2 * SEQ, SEQ) == 2 * SEQ // WIDTH
    assert auto_loss_chunks(50257, 768, 4 * 1024, 1024) == 6  # GPT-2 at 4 x 1,024 tokens
    assert auto_loss_chunks(128256, 2048, 2048, 2048) == 1  # Llama-3.2-1B at 2,048 tokens
    assert auto_loss_chunks(50257, 8, 4 * 16, 16) == 8  # at most one chunk per position
    model = _model("llama")
    got = enable(model, "1GB", example_input=_batches("llama")[0], loss_chunks="auto", repeats=1)
    assert planned(got).profile.measured.extra["loss_chunks"] == 2 * SEQ // WIDTH


def _measured_peak(model: nn.Module, batch: dict) -> int:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    peak = 0
    for _ in range(2):  # the second step: the optimizer's state exists before it
        step_batch = {k: profiled_copy(v) for k, v in batch.items()}
        opt.zero_grad(set_to_none=True)

        def step(b: dict = step_batch) -> None:
            model(**b).loss.backward()
            opt.step()

        state = [t for s in opt.state.values() for t in s.values()]
        held = [*model.parameters(), *model.buffers(), *step_batch.values(), *state]
        peak, _ = allocator_peak(step, held, torch.device("cpu"))
    return peak


def test_the_measured_peak_is_below_the_unchunked_plans():
    """At each way's least memory, the chunked plan measures less than the plan without chunks
    (the allocator's own count, apart from memplan's): the logits are never whole."""
    model = _model("llama")
    example = _batch("llama", torch.Generator().manual_seed(1), size=8)
    peaks = {}
    for chunks in (None, 4):
        m = enable(
            copy.deepcopy(model), "1GB", example_input=example, loss_chunks=chunks, repeats=1,
            optimizer="adam",
        )  # fmt: skip
        prof = planned(m).profile
        m = enable(m, _least(prof, output_held=False), example_input=example,
                   loss_chunks=chunks, profile=prof, optimizer="adam", output_held=False)  # fmt: skip
        peaks[chunks] = (_measured_peak(m, example), planned(m).schedule.peak_memory)
    logits = 8 * SEQ * VOCAB * 4  # float32: 524 KB
    assert peaks[4][0] < peaks[None][0] - logits, peaks
    assert peaks[4][1] < peaks[None][1], peaks


def test_transformers_trainer_with_the_chunked_loss(tmp_path):
    """``Trainer(model=enable(model, memory, example_input=batch, loss_chunks=4))``: Trainer's
    own loop (AdamW, its ``num_items_in_batch``) gives plain Trainer's parameters."""
    pytest.importorskip("accelerate")
    model = _model("gpt2")
    gen = torch.Generator().manual_seed(3)
    data = [
        {k: v[0] for k, v in _batch("gpt2", gen, 1, SEQ).items() if k != "attention_mask"}
        for _ in range(6)
    ]
    example = transformers.default_data_collator(data[:2])
    results = []
    for chunked in (False, True):
        m = copy.deepcopy(model)
        m.config.use_cache = False
        if chunked:
            m = enable(m, "1GB", example_input=example, loss_chunks=4, repeats=1)
            # Trainer steps AdamW (for-loop on CPU) and holds no output: optimizer="auto" plans
            # for AdamW's larger step (foreach) until it sees Trainer's
            least = _least(planned(m).profile, "adamw:foreach", output_held=False)
            m = enable(m, least, example_input=example, loss_chunks=4,
                       profile=planned(m).profile, output_held=False)  # fmt: skip
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / str(chunked)), max_steps=3, per_device_train_batch_size=2,
            learning_rate=1e-2, use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
        )  # fmt: skip
        trainer = transformers.Trainer(model=m, args=args, train_dataset=data)
        trainer.train()
        results.append(trainer.model)
    assert planned(results[1]).counters.backwards[0] == 1
    _assert_same(*results)


def test_what_the_chunked_loss_refuses():
    model = _model("gpt2")
    example = _batches("gpt2")[0]
    got = enable(copy.deepcopy(model), "1GB", example_input=example, loss_chunks=2, repeats=1)
    with pytest.raises(InputError, match="call it with labels"):
        got(input_ids=example["input_ids"])
    with pytest.raises(InputError, match="loss_chunks 0"):
        enable(copy.deepcopy(model), "1GB", example_input=example, loss_chunks=0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(InputError, match="Hugging Face causal and masked language models"):
        enable(net, "1GB", example_input=torch.randn(2, 4), loss_chunks=2)
    with pytest.raises(InputError, match="measured with the loss in 2 chunks"):
        enable(copy.deepcopy(model), "1GB", example_input=example, loss_chunks=4,
               profile=planned(got).profile)  # fmt: skip


def test_a_plan_made_with_chunks_is_applied_with_them():
    from memplan.torch.runtime.planned import apply_plan

    model = _model("llama")
    example = _batches("llama")[0]
    got = enable(copy.deepcopy(model), "1GB", example_input=example, loss_chunks=2, repeats=1)
    plan = planned(got)
    again = apply_plan(copy.deepcopy(model), plan.schedule, plan.profile, example)
    assert planned(again).names[-1] == CHUNKED_STAGE
    assert again(**example).logits is None
