"""Hugging Face transformers models (memplan.torch.models.hf): built from config classes, cut into
chains, checked against the model's own logits and loss, and trained under rotor and pofo plans
with the gradients of the model's own training step (``model(input_ids, labels=...).loss``)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

from typer.testing import CliRunner  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.cli.app import app  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.torch import build_model, fit, linearize, profile_model  # noqa: E402
from memplan.torch.models.hf import HF_PRESETS, parse_config  # noqa: E402
from memplan.torch.runtime.plan import planned_forward_counts  # noqa: E402
from memplan.torch.split.hf import HFLoss, hf_batch  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 128
TINY = {  # preset -> config values of a small model of that architecture
    "gpt2": "n_layer=3,n_embd=64,n_head=4,vocab_size=128,n_positions=64,bos_token_id=0,"
    "eos_token_id=0",
    "llama": "num_hidden_layers=3,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=128,max_position_embeddings=64,bos_token_id=0,"
    "eos_token_id=0",
    "bert": "num_hidden_layers=3,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
    "vocab_size=128,max_position_embeddings=64",
    "vit": "num_hidden_layers=3,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
    "image_size=32,patch_size=8,num_labels=10",
}
NAMES = {  # preset -> (first stage, block stage prefix)
    "gpt2": ("embedding", "h."),
    "llama": ("embedding", "layers."),
    "bert": ("embedding", "layer."),
    "vit": ("stem", "layers."),
}


def _tiny(name: str, batch: int = 2, seq: int = 16):
    shape = (3, 32, 32) if name == "vit" else (seq,)
    return build_model(f"hf:{name}", batch_size=batch, input_shape=shape, config=TINY[name])


def _own_loss(model, x, labels):
    key = model.main_input_name
    extra = {} if key == "pixel_values" else {"use_cache": False}
    return model(**{key: x}, labels=labels, **extra).loss


@pytest.mark.parametrize("name", sorted(TINY))
def test_chain_reproduces_the_models_logits_and_loss(name):
    model, x, label = _tiny(name)
    assert label.startswith(f"hf:{name}[") and model.training
    chain = linearize(model, x)
    first, block = NAMES[name]
    assert chain.names == [first, *(f"{block}{i}" for i in range(3)), "head", "loss"]
    loss_stage = chain.modules[-1]
    assert isinstance(loss_stage, HFLoss)
    assert model.training  # linearize restores the flags
    model.eval()
    with torch.no_grad():
        key = model.main_input_name
        torch.testing.assert_close(chain.logits(x), model(**{key: x}).logits)
        # the loss stage is the loss the model's own forward computes from the same labels
        torch.testing.assert_close(chain.forward(x), _own_loss(model, x, loss_stage.labels))


def test_default_labels():
    model, x, _ = _tiny("gpt2")
    assert torch.equal(linearize(model, x).modules[-1].labels, x)  # next-token on the input
    model, x, _ = _tiny("bert", batch=4, seq=32)
    labels = linearize(model, x).modules[-1].labels
    picked = labels != -100
    assert 0 < int(picked.sum()) < x.numel() // 2 and torch.equal(labels[picked], x[picked])
    model, x, _ = _tiny("vit")
    labels = linearize(model, x).modules[-1].labels
    assert labels.shape == (2,) and int(labels.max()) < 10


def _recomputing_budget(prof) -> int:
    """A third of the way from the least memory to store-all's, for a loop that keeps its
    gradients (in PyTorch's default loop these tiny models need as much memory with
    recomputation as without: their weight gradients make the peak)."""
    desc = describe(prof, "sgd", "kept")
    least, store_all = desc["min_memory"]["chain"], desc["store_all_memory"]
    return least + (store_all - least) // 3


def _fixed_numbers(prof):
    """The model's sizes with fixed numbers for what the CPU decides (1 ms forwards, 2 ms
    backwards, no temporary memory): its plans depend on the model alone, not on the kernels
    of the CPU that measured it."""
    data = prof.model_dump(exclude_none=True)
    for stage in data["stages"]:
        stage.update(forward_time=1.0, backward_time=2.0, forward_overhead=0, backward_overhead=0)
    return memplan.load_profile(data)


def _pofo_plan(prof):
    """A pofo plan that both recomputes and offloads: fixed stage times (the CPU's are noisy),
    300 MB/s (a saved block of these models moves in about a forward's time), a scan of 32
    budgets between rotor's least memory and the store-all need."""
    data = prof.model_dump(exclude_none=True)
    data["bandwidth"] = 3e8
    for stage in data["stages"]:
        stage.update(forward_time=1.0, backward_time=2.0)
    timed = memplan.load_profile(data)
    desc = describe(timed, "none")
    lo, hi = desc["min_memory"]["chain"], desc["store_all_memory"]
    for i in range(32):
        memory = lo + (hi - lo) * i // 32
        sched = memplan.solve(timed, "pofo", memory, optimizer="none", slots=500)
        if sched.feasible and sched.count("offload") and sched.count("F_ck"):
            return timed, memory
    raise AssertionError("no budget where pofo both recomputes and offloads")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def decoder(request):
    model, x, _ = _tiny(request.param)
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1)
    assert prof.model == f"hf:{request.param}"
    return request.param, model, x, _fixed_numbers(prof)


def _train_with_fit(model, x, prof, **kw):
    """One iteration of fit()'s wrapped chain vs the HF model's own training step."""
    ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    labels = x.clone()
    labels[:, :2] = -100  # labels of the batch are used (some ignored, as HF allows)
    batch = {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": labels}
    wrapped, sched = fit(got, batch, profile=prof, **{"optimizer": "sgd", **kw})
    torch.manual_seed(11)  # GPT-2 has dropout: the masks must be the same
    expected = _own_loss(ref, x, labels)
    expected.backward()
    torch.manual_seed(11)
    loss = wrapped(x)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m, n=name: f"{n}: {m}")
    counts = [wrapped.counters.forward_count(k) for k in range(prof.length)]
    assert counts == planned_forward_counts(sched, prof.length)
    return sched


def test_decoder_trains_under_a_rotor_plan_like_hf(decoder):
    name, model, x, prof = decoder
    sched = _train_with_fit(
        model, x, prof, memory=_recomputing_budget(prof), algo="rotor", gradients="kept"
    )
    assert sum(planned_forward_counts(sched, prof.length)) > prof.length  # it recomputes


def test_decoder_trains_under_a_pofo_plan_like_hf(decoder):
    name, model, x, prof = decoder
    timed, memory = _pofo_plan(prof)
    sched = _train_with_fit(
        model, x, timed, memory=memory, algo="pofo", optimizer="none", slots=500
    )
    assert sched.family == "combined" and sched.count("offload") >= 1
    assert sum(planned_forward_counts(sched, prof.length)) > prof.length


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_encoders_train_under_a_rotor_plan_like_hf(name):
    model, x, _ = _tiny(name)
    prof = _fixed_numbers(profile_model(copy.deepcopy(model), example_input=x, repeats=1))
    ref, got = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    labels = linearize(model, x).modules[-1].labels
    wrapped, sched = fit(
        got,
        x,
        memory=_recomputing_budget(prof),
        profile=prof,
        labels=labels,
        gradients="kept",
        optimizer="sgd",
    )
    assert sum(planned_forward_counts(sched, prof.length)) > prof.length
    torch.manual_seed(3)
    expected = _own_loss(ref, x, labels)
    expected.backward()
    torch.manual_seed(3)
    loss = wrapped(x)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    for (n, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m, n=n: f"{n}: {m}")


def test_profile_of_a_tiny_gpt2_has_the_chain_sizes():
    model, x, _ = _tiny("gpt2", batch=2, seq=16)
    prof = profile_model(model, example_input=x, repeats=1, name="tiny")
    embedding, *blocks, head, loss = prof.stages
    hidden = 2 * 16 * 64 * 4
    assert all(s.output_size == hidden for s in [embedding, *blocks])
    assert head.output_size == 2 * 16 * VOCAB * 4  # the logits
    # GPT-2 ties its output layer to the token embedding: counted once, in the embedding stage.
    # weight_size also counts 4 bytes per parameter tensor (Adam's step count, docs/runtime.md):
    # wte and wpe; ln_f's weight and bias.
    step_counts = 2 * 4
    assert embedding.weight_size == (VOCAB + 64) * 64 * 4 + step_counts
    assert head.weight_size == 2 * 64 * 4 + step_counts
    assert loss.output_size == 4


def test_config_overrides_and_names():
    model, x, label = build_model(
        "hf:gpt2", config="num_hidden_layers=2,n_embd=32,n_head=2", batch_size=1, input_shape=(8,)
    )
    assert model.config.n_layer == 2 and model.config.n_embd == 32
    assert label == "hf:gpt2[num_hidden_layers=2,n_embd=32,n_head=2]"
    assert tuple(x.shape) == (1, 8) and int(x.max()) < model.config.vocab_size
    assert parse_config("a=1,b=0.5,c=true,d=none,e=gelu") == {
        "a": 1, "b": 0.5, "c": True, "d": None, "e": "gelu",
    }  # fmt: skip
    with pytest.raises(
        InputError, match="GPT2Config has no field 'n_layers'; did you mean n_layer"
    ):
        build_model("hf:gpt2", config="n_layers=2")
    with pytest.raises(InputError, match="NAME=VALUE"):
        build_model("hf:gpt2", config="n_layer")
    with pytest.raises(InputError, match="encoder-decoder"):
        build_model("hf:t5", config="num_layers=1,d_model=32,d_ff=64,num_heads=2,d_kv=16")
    with pytest.raises(InputError, match="unknown model hf:gtp2 .*did you mean hf:gpt2"):
        build_model("hf:gtp2")
    with pytest.raises(InputError, match="sequence length must be 1..64"):
        build_model("hf:gpt2", config="n_positions=64,n_layer=1", input_shape=(65,))
    with pytest.raises(InputError, match="only hf: models take config values"):
        build_model("resnet18", config="n_layer=2")
    with pytest.raises(InputError, match="GiB in float32"):
        build_model("hf:gpt2", config="n_layer=1,vocab_size=2000000000")  # on the meta device


def test_presets_are_the_sizes_people_train():
    counts = {}
    for name in ("gpt2", "llama-1b", "bert", "vit-b-16"):
        preset = HF_PRESETS[name]
        cls = transformers.CONFIG_MAPPING[preset.model_type]
        config = cls(**preset.config)
        auto = {
            "causal-lm": transformers.AutoModelForCausalLM,
            "masked-lm": transformers.AutoModelForMaskedLM,
            "image-classification": transformers.AutoModelForImageClassification,
        }[preset.task]
        with torch.device("meta"):
            model = auto.from_config(config)
        counts[name] = sum(p.numel() for p in model.parameters())
    assert counts["gpt2"] == 124_439_808  # GPT-2 small, tied output layer
    assert counts["llama-1b"] == 1_235_814_400  # Llama 3.2 1B
    assert 109_000_000 < counts["bert"] < 111_000_000  # BERT-base with its MLM head
    assert 86_000_000 < counts["vit-b-16"] < 87_000_000  # ViT-B/16, 1000 classes


def test_hf_batch():
    x = torch.zeros(2, 4, dtype=torch.long)
    assert hf_batch({"input_ids": x, "attention_mask": torch.ones_like(x)})[0] is x
    with pytest.raises(InputError, match="padding"):
        hf_batch({"input_ids": x, "attention_mask": torch.tensor([[1, 1, 1, 0], [1] * 4])})
    with pytest.raises(InputError, match="batch.past_key_values"):
        hf_batch({"input_ids": x, "past_key_values": x})
    with pytest.raises(InputError, match="input_ids or pixel_values"):
        hf_batch({"labels": x})


def test_cli_profiles_a_small_hf_model_and_solves(tmp_path):
    runner = CliRunner()
    out = tmp_path / "gpt2.yaml"
    args = ["profile", "hf:gpt2", "--config", TINY["gpt2"], "-b", "1", "--input-shape", "16"]
    result = runner.invoke(app, [*args, "--repeats", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    prof = memplan.load_profile(out)
    assert prof.model.startswith("hf:gpt2[") and prof.length == 6
    result = runner.invoke(app, ["solve", str(out), "--algo", "rotor", "--mem", "2GB"])
    assert result.exit_code == 0, result.output
    bad = runner.invoke(app, ["profile", "resnet18", "--config", "n_layer=2"])
    assert bad.exit_code == 2 and "only hf: models take config values" in bad.output
    bad = runner.invoke(app, ["profile", "hf:gpt2", "--config", "n_layer"])
    assert bad.exit_code == 2 and "NAME=VALUE" in bad.output
    bad = runner.invoke(app, ["profile", "hf:t5"])
    assert bad.exit_code == 2 and "encoder-decoder" in bad.output


def test_memplan_and_its_cli_do_not_import_transformers():
    code = (
        "import sys, memplan, memplan.cli.app, memplan.torch\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_the_issue_command_exits_0_on_cpu(tmp_path):
    """Issue 15's command, as a user types it: GPT-2 small (124 M), 128 tokens (on the CPU
    here; on CUDA where there is one)."""
    memplan_cli = str(Path(sys.executable).with_name("memplan"))
    command = (
        f"set -o pipefail; {memplan_cli} profile hf:gpt2 --batch-size 1 --input-shape 128 | "
        f"{memplan_cli} solve --algo rotor --mem 2GB"
    )
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "memplan: profiled hf:gpt2: 15 stages on" in result.stderr
    assert "rotor (chain)" in result.stderr and "optimal" in result.stderr
