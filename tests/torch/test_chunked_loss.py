"""A language model's head and loss as one stage in chunks of tokens
(memplan.torch.split.chunked_loss): the same loss and parameters as plain training after several
SGD steps on different batches, planned peak = measured peak, and bad uses refused with a
one-line error."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

from typer.testing import CliRunner  # noqa: E402

import memplan  # noqa: E402
from memplan.cli.app import app  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import build_model, fit, linearize, profile_model  # noqa: E402
from memplan.torch.compare.training import compare_training  # noqa: E402
from memplan.torch.runtime.plan import planned_forward_counts  # noqa: E402
from memplan.torch.split.chunked_loss import (  # noqa: E402
    CHUNKED_STAGE,
    ChunkedLoss,
    chunk_loss,
    profile_loss_chunks,
)
from memplan.torch.split.hf import default_labels  # noqa: E402

pytestmark = pytest.mark.torch

CHUNKS = 3
TINY = {  # small models of each architecture (no dropout in BERT: its masks would differ)
    "gpt2": "n_layer=2,n_embd=32,n_head=2,vocab_size=96,n_positions=32,bos_token_id=0,"
    "eos_token_id=0",
    "llama": "num_hidden_layers=2,hidden_size=32,intermediate_size=64,num_attention_heads=2,"
    "num_key_value_heads=1,vocab_size=96,max_position_embeddings=32,bos_token_id=0,"
    "eos_token_id=0",
    "bert": "num_hidden_layers=2,hidden_size=32,intermediate_size=64,num_attention_heads=2,"
    "vocab_size=96,max_position_embeddings=32,hidden_dropout_prob=0.0,"
    "attention_probs_dropout_prob=0.0",
}


def _tiny(name: str, batch: int = 2, seq: int = 16):
    return build_model(f"hf:{name}", batch_size=batch, input_shape=(seq,), config=TINY[name])


def _fixed_numbers(prof):
    """Fixed times (the CPU's are noisy): the plans depend on the sizes alone."""
    data = prof.model_dump(exclude_none=True)
    for stage in data["stages"]:
        stage.update(forward_time=1.0, backward_time=2.0)
    return memplan.load_profile(data)


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_stage_replaces_head_and_loss_with_the_same_loss(name):
    model, x, _ = _tiny(name)
    plain = linearize(model, x)
    chunked = chunk_loss(plain, x, CHUNKS, name)
    assert plain.names[-2:] == ["head", "loss"]
    assert chunked.names == [*plain.names[:-2], CHUNKED_STAGE]
    stage = chunked.modules[-1]
    assert isinstance(stage, ChunkedLoss) and stage.head is plain.modules[-2]
    assert len(chunked.inplace) == len(chunked.names)
    model.eval()  # GPT-2's dropout off
    with torch.no_grad():
        torch.testing.assert_close(chunked.forward(x), plain.forward(x))


@pytest.mark.parametrize("name", sorted(TINY))
def test_training_under_a_recomputing_plan_equals_plain_training(name):
    """Several SGD steps on different batches, each batch's own labels: the parameters stay
    those of the model's own training step (``model(input_ids, labels=...).loss``)."""
    model, x, _ = _tiny(name)
    ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, loss_chunks=CHUNKS)
    assert prof.stages[-1].name == CHUNKED_STAGE and profile_loss_chunks(prof) == CHUNKS
    prof = _fixed_numbers(prof)
    least = memplan.solve(prof, "rotor", 1).min_memory
    wrapped, sched = fit(got, x, memory=least, profile=prof, optimizer="sgd")
    assert sum(planned_forward_counts(sched, prof.length)) > prof.length  # it recomputes
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    got_opt = torch.optim.SGD(got.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(5)
    for step in range(3):
        batch = torch.randint(0, 96, tuple(x.shape), generator=generator)
        labels = default_labels(model, batch, seed=step)
        if name != "bert":
            labels[:, :2] = -100  # some positions ignored, as HF allows
        torch.manual_seed(step)  # GPT-2 has dropout: the same masks
        expected = ref(input_ids=batch, labels=labels, use_cache=False).loss
        expected.backward()
        torch.manual_seed(step)
        loss = wrapped(batch, labels)
        loss.backward()
        torch.testing.assert_close(loss, expected)
        counts = [wrapped.counters.forward_count(k) for k in range(prof.length)]
        assert counts == planned_forward_counts(sched, prof.length)
        for opt in (ref_opt, got_opt):
            opt.step()
            opt.zero_grad()
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def test_the_builtin_gpt_chunks_its_next_token_loss():
    model, x, _ = build_model("gpt-tiny", batch_size=2)
    model.eval()
    plain = linearize(model, x)
    chunked = chunk_loss(plain, x, 4)
    assert chunked.names[-1] == CHUNKED_STAGE
    torch.testing.assert_close(chunked.forward(x), plain.forward(x))
    other = torch.randint(0, 100, tuple(x.shape), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the batch's own tokens as targets, as NextTokenLoss takes them
        hidden = chunked.forward(x, stop=len(chunked) - 1)
        logits = plain.modules[-2](hidden)
        torch.testing.assert_close(
            chunked.modules[-1](hidden, other), plain.modules[-1](logits, other)
        )


@pytest.mark.parametrize("name", sorted(TINY))
def test_planned_is_measured_and_the_least_memory_drops(name):
    """The chunked stage is measured like any other: store-all and rotor's least memory plan
    what they measure (within 2%), and the least memory is below the plain chain's."""
    config = TINY[name].replace("vocab_size=96", "vocab_size=2000")
    common = dict(
        config=config, batch_size=2, input_shape=(32,), rounds=1, segments=(),
        compile_budgets=(), at_alternatives=False, repeats=1,
    )  # fmt: skip
    found = compare_training(f"hf:{name}", loss_chunks=4, **common)
    assert found.loss_chunks == 4 and found.chunked_profile.stages[-1].name == CHUNKED_STAGE
    assert found.profile.stages[-1].name == "loss"  # enable's rows: the model's own loss
    rows = {o.name: o for o in found.outcomes}
    plain = rows["plain"]
    store_all = rows["memplan store-all, loss_chunks=4"]
    least = rows["memplan rotor, loss_chunks=4 (least memory)"]
    for row in (store_all, least):
        assert row.loss_chunks == 4, row
        assert row.grads in ("equal", "close"), (row.name, row.grads, row.grad_error)
        assert abs(row.planned_peak - row.peak) <= 0.02 * row.peak, (
            row.name,
            row.planned_peak,
            row.peak,
        )
    assert least.peak <= least.budget  # enable's budget holds
    assert store_all.peak < plain.peak  # the logits are never whole
    assert least.peak < rows["memplan rotor (least memory)"].peak  # enable's, the model's loss
    # the loss a user writes in chunks: the model's own, its gradients plain training's
    by_hand = rows["hf checkpointing + loss in 4 chunks"]
    assert by_hand.skipped is None and by_hand.grads in ("equal", "close"), by_hand
    assert by_hand.peak < rows["hf checkpointing"].peak


def test_bad_uses_are_one_line_errors():
    model, x, _ = build_model("resnet18", batch_size=2, input_shape=(3, 32, 32))
    with pytest.raises(InputError, match="not a language model"):
        chunk_loss(linearize(model, x), x, 4, "resnet18")
    model, x, _ = _tiny("gpt2")
    chain = linearize(model, x)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match="expected a positive integer"):
            chunk_loss(chain, x, bad)
    assert chunk_loss(chain, x, None) is chain
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, loss_chunks=2)
    with pytest.raises(InputError, match="measured with the loss in 2 chunks"):
        profile_loss_chunks(prof, 3)
    plain = profile_model(copy.deepcopy(model), example_input=x, repeats=1)
    with pytest.raises(InputError, match="without chunks"):
        fit(copy.deepcopy(model), x, memory="1GB", profile=plain, loss_chunks=2)


def test_a_head_that_mixes_tokens_is_refused():
    model, x, _ = _tiny("gpt2")
    chain = linearize(model, x)
    head = chain.stages[-2][1]

    class Mixing(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = head

        def forward(self, h):
            return self.head(h + h.mean(dim=1, keepdim=True))

    chain.stages[-2] = ("head", Mixing())
    with pytest.raises(InputError, match="does not act on each token alone"):
        chunk_loss(chain, x, 4, "mixing")


def test_a_head_replayed_from_a_tape_of_the_batch_is_refused():
    # a head traced from the model's forward that read tensors of the example batch (an earlier
    # block's activation here; Inkling-2's tiny model) runs on a batch of that shape only: on a
    # chunk of its tokens it would raise; refused with the way out, and never advised
    from memplan.torch.split.chunked_loss import head_reads_batch
    from memplan.torch.split.repeated import find_repeated_blocks

    class ReadsFirst(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(96, 8)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
            self.out = torch.nn.Linear(8, 96)

        def forward(self, ids):
            h = first = self.blocks[0](self.embed(ids))
            for block in self.blocks[1:]:
                h = block(h)
            return self.out(h + first)

    ids = torch.randint(0, 96, (2, 16))
    tape = find_repeated_blocks(ReadsFirst(), ids).stages[-1][1]
    assert head_reads_batch(tape)
    model, x, _ = _tiny("gpt2")
    chain = linearize(model, x)
    assert not head_reads_batch(chain.stages[-2][1])
    chain.stages[-2] = ("head", torch.nn.ModuleList([chain.stages[-2][1], tape]))
    with pytest.raises(InputError, match="traced for the whole batch"):
        chunk_loss(chain, x, 4, "reads")


def test_a_head_call_holding_tensors_of_the_batch_is_not_chunked():
    # a head module called with a tensor traced for the example batch besides the hidden states
    # (CPM-Ant's head reads the hidden states past its prompt: a view of the traced geometry)
    from memplan.torch.split.chunked_loss import head_reads_batch
    from memplan.torch.split.trace import PRIMARY
    from memplan.torch.split.wrappers import BlockCall

    linear = torch.nn.Linear(4, 4)
    plain = BlockCall(linear, (PRIMARY,), {}, (2, 3, 4))
    holding = BlockCall(linear, (PRIMARY,), {"mask": torch.ones(2, 3)}, (2, 3, 4))
    assert not head_reads_batch(torch.nn.Sequential(plain))
    assert head_reads_batch(torch.nn.Sequential(plain, holding))


def test_cli_profile_bench_and_run_take_loss_chunks(tmp_path):
    runner = CliRunner()
    base = ["hf:gpt2", "--config", TINY["gpt2"], "-b", "2", "--input-shape", "16"]
    out = tmp_path / "p.yaml"
    done = runner.invoke(
        app, ["profile", *base, "--repeats", "1", "--loss-chunks", "2", "-o", str(out)]
    )
    assert done.exit_code == 0, done.output
    prof = memplan.load_profile(out)
    assert prof.stages[-1].name == CHUNKED_STAGE and profile_loss_chunks(prof) == 2
    done = runner.invoke(
        app, ["run", *base, "--profile", str(out), "--mem", "1GB", "--loss-chunks", "3"]
    )
    assert done.exit_code == 2 and "measured with the loss in 2 chunks" in done.output
    done = runner.invoke(
        app, ["run", *base, "--profile", str(out), "--mem", "1GB", "--steps", "1", "-f", "json"]
    )
    assert done.exit_code == 0, done.output
    assert '"head+loss"' in done.output
    done = runner.invoke(app, ["profile", "resnet18", "-b", "1", "--loss-chunks", "2"])
    assert done.exit_code == 2 and "not a language model" in done.output
    done = runner.invoke(app, ["profile", *base, "--loss-chunks", "0"])
    assert done.exit_code == 2 and "--loss-chunks 0" in done.output
    assert "--loss-chunks" in runner.invoke(app, ["bench", "--help"]).output


@pytest.mark.parametrize("name", sorted(TINY))
def test_gradients_are_plain_ones_scaled_by_the_outputs(name):
    """The stage's gradients (made in its forward) against the plain head and loss, for a loss
    scaled as a GradScaler scales it; without gradients the same loss."""
    model, x, _ = _tiny(name)
    model.eval()
    plain = linearize(model, x)
    stage = chunk_loss(plain, x, CHUNKS, name).modules[-1]
    head, loss = plain.modules[-2:]
    with torch.no_grad():
        hidden = plain.forward(x, stop=len(plain) - 2)
        torch.testing.assert_close(stage(hidden), loss(head(hidden)))
    _assert_plain_gradients(stage, head, loss, hidden)
    assert stage.logits_in_place  # each chunk's gradient written over its logits


def _assert_plain_gradients(stage, head, loss, hidden, atol=1e-7):
    params = list(head.parameters())
    found = []
    for way in (lambda h: loss(head(h)), stage):
        h = hidden.clone().requires_grad_()
        (way(h) * 3.0).backward()
        found.append([h.grad, *(p.grad for p in params)])
        for p in params:
            p.grad = None
    for got, expected in zip(found[1], found[0], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=atol)


def test_a_tied_gradient_is_strided_as_its_parameter():
    """A head that reads its tied weight transposed into a new tensor (MobileBERT concatenates
    ``decoder.weight.t()`` with another weight):
    autograd gives the weight a transposed gradient, which the stage writes into ``.grad``
    strided as the parameter, as ``AccumulateGrad`` does (fused AdamW steps ``.grad`` element by
    element in the parameter's order: a transposed one trained MobileBERT's tiny model away from
    plain training)."""
    model, x, _ = _tiny("gpt2")
    model.eval()
    plain = linearize(model, x)
    inner = plain.stages[-2][1]  # the final norm, the tied projection (their calls)
    projection = inner[-1].block
    assert isinstance(projection, torch.nn.Linear)

    class Transposed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = inner

        def forward(self, h):
            return self.head[:-1](h).matmul(projection.weight.t().contiguous())

    plain.stages[-2] = ("head", Transposed())
    chunked = chunk_loss(plain, x, CHUNKS, "transposed")
    tied = projection.weight
    assert tied is model.get_input_embeddings().weight
    found = []
    for chain in (plain, chunked):
        chain.forward(x).backward()
        found.append(tied.grad)
        tied.grad = None
    assert chunked.modules[-1].tied_into_grad  # written into .grad, not returned
    assert found[1].stride() == tied.stride() == found[0].stride()
    torch.testing.assert_close(found[1], found[0], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(TINY))
def test_a_head_that_saves_its_output_gets_autograds_gradients(name):
    """A head whose last operation keeps its output for its backward (``tanh``): the logits are
    not written over, and the gradients are still plain training's."""
    model, x, _ = _tiny(name)
    model.eval()
    plain = linearize(model, x)
    inner = plain.stages[-2][1]

    class Saving(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = inner

        def forward(self, h):
            return torch.tanh(self.head(h))

    plain.stages[-2] = ("head", Saving())
    stage = chunk_loss(plain, x, CHUNKS, name).modules[-1]
    head, loss = plain.modules[-2:]
    with torch.no_grad():
        hidden = plain.forward(x, stop=len(plain) - 2)
    _assert_plain_gradients(stage, head, loss, hidden, atol=1e-6)  # rounding (BERT: 1.5e-7)
    assert not stage.logits_in_place


def test_writing_over_the_logits_lowers_the_least_memory(monkeypatch):
    """One chunk tensor instead of three (the logits, their log-softmax, their gradient): with
    chunks larger than the output projection, the head+loss stage sets the least memory, which
    drops by at least one chunk's logits (planned; planned = measured is checked above)."""
    config = TINY["gpt2"].replace("vocab_size=96", "vocab_size=4000")
    model, x, _ = build_model("hf:gpt2", batch_size=4, input_shape=(32,), config=config)
    least = {}
    for in_place in (False, True):
        monkeypatch.setattr(ChunkedLoss, "write_over_logits", in_place)
        prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, loss_chunks=2)
        least[in_place] = memplan.solve(_fixed_numbers(prof), "rotor", 1).min_memory
    chunk_logits = 4 * 32 // 2 * 4000 * 4
    assert least[True] <= least[False] - chunk_logits, least


def test_the_profile_keeps_no_logits():
    """The stage keeps the gradients of its input and of the head's weights, not the logits;
    its forward's peak a few chunks' logits, not the batch's."""
    config = TINY["gpt2"].replace("vocab_size=96", "vocab_size=2000").replace("=32,", "=64,")
    model, x, _ = build_model("hf:gpt2", batch_size=4, input_shape=(64,), config=config)
    plain = profile_model(copy.deepcopy(model), example_input=x, repeats=1)
    chunked = profile_model(copy.deepcopy(model), example_input=x, repeats=1, loss_chunks=8)
    head, loss = plain.stages[-2:]
    stage = chunked.stages[-1]
    weights = sum(p.numel() * 4 for p in model.get_output_embeddings().parameters())
    logits = 4 * 64 * 2000 * 4
    assert stage.saved_size <= head.output_size + weights + 1024  # + the head norm's
    assert head.saved_size + loss.saved_size >= logits
    assert stage.forward_overhead < logits  # a few chunks of logits and one weight gradient


def test_the_forward_holds_one_copy_of_the_output_weights_gradient():
    """With chunks smaller than the output projection, the forward's peak beyond what the stage
    keeps is below one weight gradient: each chunk's is added in place into the running sum (no
    chunk holds its own copy)."""
    config = TINY["gpt2"].replace("vocab_size=96", "vocab_size=4000")
    model, x, _ = build_model("hf:gpt2", batch_size=2, input_shape=(32,), config=config)
    prof = profile_model(model, example_input=x, repeats=1, loss_chunks=16)  # 4 tokens a chunk
    stage = prof.stages[-1]
    weight_grad = model.get_output_embeddings().weight.numel() * 4
    assert stage.name == CHUNKED_STAGE and stage.weight_grad_size >= weight_grad
    assert stage.forward_overhead < weight_grad
