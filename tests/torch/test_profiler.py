"""memplan.torch.profiler.model: measured profiles, hand-computed saved sizes, the bundled profiles."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.errors import InputError  # noqa: E402
from memplan.profile import Profile, bundled_profiles, load_profile, save_profile  # noqa: E402
from memplan.torch import build_model, linearize  # noqa: E402
from memplan.torch.measure.stage import measure_stage  # noqa: E402
from memplan.torch.profiler.model import profile_model  # noqa: E402

pytestmark = pytest.mark.torch

F32 = 4


@pytest.fixture(scope="module")
def resnet18_profile() -> Profile:
    return profile_model("resnet18", batch_size=2, input_shape=(3, 64, 64), repeats=1)


@pytest.fixture(scope="module")
def gpt_tiny_profile() -> Profile:
    return profile_model("gpt-tiny", batch_size=2, input_shape=(16,), repeats=1)


def _check_profile(prof: Profile) -> None:
    again = load_profile(save_profile(prof))  # YAML round trip, validated
    assert again == prof
    assert prof.device is not None and prof.device.kind == "cpu" and prof.device.name
    # CPU: the runtime's own offload copy, timed (docs/profiling.md, "bandwidth")
    assert prof.bandwidth is not None and prof.bandwidth > 0
    assert "runtime's CPU offload copy" in prof.measured.extra["bandwidth"]
    assert prof.measured is not None and prof.measured.tool == f"memplan {memplan.__version__}"
    assert prof.measured.torch == torch.__version__ and prof.measured.repeats == 1
    assert prof.measured.date and prof.measured.date.endswith("Z")
    assert prof.stages[-1].name == "loss" and prof.stages[-1].output_size == F32
    for stage in prof.stages:
        assert stage.output_size > 0 and stage.saved_size >= stage.output_size
        assert stage.forward_time > 0 and stage.backward_time > 0
        assert stage.forward_overhead >= 0 and stage.backward_overhead >= 0
    assert memplan.solve(prof, "store-all", memory="100GB").feasible


def test_resnet18_profile(resnet18_profile):
    prof = resnet18_profile
    _check_profile(prof)
    assert prof.model == "resnet18" and prof.dtype == "float32"
    assert prof.batch_size == 2 and prof.input_shape == [3, 64, 64]
    assert prof.input_size == 2 * 3 * 64 * 64 * F32
    names = [s.name for s in prof.stages]
    blocks = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert names == ["stem", *blocks, "head", "loss"]
    # weight_size: what the stages keep from one iteration to the next (docs/runtime.md):
    # parameters, buffers (batch-norm statistics, the loss targets), a 4-byte step count per
    # parameter tensor, and the loss with its gradient
    model, x, _ = build_model("resnet18", batch_size=2, input_shape=(3, 64, 64))
    chain = linearize(model, x)
    buffers = sum(b.numel() * b.element_size() for m in chain.modules for b in m.buffers())
    assert buffers > 2 * 8  # the batch-norm statistics and the two int64 targets
    tensors = len(list(model.parameters()))
    assert prof.weight_size == 11_689_512 * F32 + buffers + 4 * tensors + 2 * F32
    stem, head, loss = prof.stages[0], prof.stages[-2], prof.stages[-1]
    assert stem.output_size == 2 * 64 * 16 * 16 * F32  # after conv1 (/2) and maxpool (/2)
    conv_out = 2 * 64 * 32 * 32 * F32
    # bn1 keeps its input, relu (in place) its result, maxpool its indices; plus the output
    assert stem.saved_size >= 2 * conv_out + stem.output_size
    assert head.output_size == 2 * 1000 * F32
    assert loss.saved_size >= 2 * 1000 * F32  # the log-softmax of the logits
    assert all(s.grad_size is None for s in prof.stages)


def test_gpt_tiny_profile(gpt_tiny_profile):
    prof = gpt_tiny_profile
    _check_profile(prof)
    assert [s.name for s in prof.stages] == ["embedding", "block0", "block1", "head", "loss"]
    assert prof.batch_size == 2 and prof.input_shape == [16]
    assert prof.input_size == 2 * 16 * 8  # int64 token ids
    hidden = 2 * 16 * 64 * F32
    assert [s.output_size for s in prof.stages[:3]] == [hidden] * 3
    assert prof.stages[3].output_size == 2 * 16 * 128 * F32  # logits
    # a block keeps far more than its output: LayerNorm, attention and MLP activations
    assert prof.stages[1].saved_size > 5 * hidden


def test_sizes_are_deterministic(gpt_tiny_profile):
    again = profile_model("gpt-tiny", batch_size=2, input_shape=(16,), repeats=1)

    def sizes(prof: Profile) -> list[tuple[int, ...]]:
        return [
            (s.output_size, s.saved_size, s.weight_size, s.forward_overhead, s.backward_overhead)
            for s in prof.stages
        ]

    assert sizes(again) == sizes(gpt_tiny_profile)


def test_saved_size_of_a_linear_stage_is_hand_computed():
    """Linear -> GELU -> Linear on a (4, 8) input, as a single stage.

    The first Linear saves its input (the stage input: excluded) and its weight (static: excluded);
    GELU saves its input (4 x 16 floats); the second Linear saves its input (the GELU output,
    4 x 16 floats); nothing saves the output (4 x 4 floats), which x-bar includes anyway.
    """
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    rng_state = torch.get_rng_state().numel()  # what a recomputation holds (fork_rng, CPU)
    for input_grad in (True, False):
        m = measure_stage(stage, x, input_grad=input_grad, repeats=1)
        assert m.output_size == 4 * 4 * F32
        assert m.saved_size == (4 * 16 + 4 * 16 + 4 * 4) * F32
        # With autograd the forward allocates only what it keeps. Without (F_ck, F_n), the
        # first Linear's output and GELU's are both alive while GELU runs: beyond the output,
        # 2 x 4 x 16 floats less the output's 4 x 4.
        assert m.forward_overhead == rng_state + (2 * 4 * 16 - 4 * 4) * F32
        assert m.backward_overhead >= 0
        assert tuple(m.output.shape) == (4, 4) and not m.output.requires_grad
        # F_all alone saves what it computes: no temporaries beyond the saved tensors
        assert m.forward_overhead_all == rng_state
        # the first Linear keeps its input for the weight's gradient; nothing keeps the output
        assert m.input_saved is True and m.output_saved is False
    assert stage[0].weight.grad is None  # the profiler leaves no gradients behind


def test_saved_sizes_of_a_sequential_chain():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    prof = profile_model(seq, example_input=x, repeats=1, name="mlp")
    assert prof.model == "mlp"
    assert [s.name for s in prof.stages] == ["linear0", "relu1", "linear2", "loss"]
    linear0, relu1, linear2, loss = prof.stages
    # a Linear keeps only its input (excluded) and weight (static): x-bar is its output alone
    assert (linear0.output_size, linear0.saved_size) == (4 * 16 * F32, 4 * 16 * F32)
    assert (linear2.output_size, linear2.saved_size) == (4 * 4 * F32, 4 * 4 * F32)
    # an in-place ReLU keeps its result, the output
    assert (relu1.output_size, relu1.saved_size) == (4 * 16 * F32, 4 * 16 * F32)
    assert relu1.output_saved is True and linear0.output_saved is False
    # the classification loss keeps the log-softmax of the logits, not the logits
    assert loss.input_saved is False and linear2.input_saved is True
    # parameters, plus a 4-byte step count per parameter tensor (weight and bias)
    assert linear0.weight_size == (8 * 16 + 16) * F32 + 2 * 4 and relu1.weight_size == 0
    assert linear2.weight_size == (16 * 4 + 4) * F32 + 2 * 4
    assert loss.saved_size >= 4 * 4 * F32 + F32  # log-softmax of the logits, and the loss
    assert prof.input_size == 4 * 8 * F32 and prof.input_shape == [8]


def test_progress_is_reported_per_stage():
    calls = []
    prof = profile_model(
        nn.Sequential(nn.Linear(4, 4), nn.Tanh()),
        example_input=torch.randn(2, 4),
        repeats=1,
        progress=lambda name, done, total: calls.append((name, done, total)),
    )
    assert calls == [(s.name, k + 1, len(prof.stages)) for k, s in enumerate(prof.stages)]


def test_profiling_restores_the_model():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile_model(model, example_input=torch.randn(5, 4), repeats=2)
    assert not model.training and not model[1].training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())


def test_bfloat16_halves_the_activations():
    prof = profile_model("gpt-tiny", batch_size=1, input_shape=(8,), dtype="bfloat16", repeats=1)
    assert prof.dtype == "bfloat16"
    assert prof.stages[1].output_size == 1 * 8 * 64 * 2


def test_bad_arguments_are_input_errors():
    seq, x = nn.Sequential(nn.Linear(2, 2)), torch.randn(1, 2)
    with pytest.raises(InputError, match="--repeats"):
        profile_model(seq, example_input=x, repeats=0)
    with pytest.raises(InputError, match="--dtype"):
        profile_model(seq, example_input=x, dtype="int8")
    with pytest.raises(InputError, match="--device"):
        profile_model(seq, example_input=x, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA device"):
            profile_model(seq, example_input=x, device="cuda")
    with pytest.raises(InputError, match="unknown model"):
        profile_model("not-a-model")


def test_unlinearizable_model_is_an_input_error():
    class TwoPaths(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            return self.a(x) + self.b(x)

    with pytest.raises(InputError, match="cannot linearize TwoPaths") as info:
        profile_model(TwoPaths(), example_input=torch.randn(2, 3), repeats=1)
    assert "\n" not in str(info.value)


def test_import_memplan_does_not_import_torch():
    code = "import sys, memplan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


BUNDLED = {  # name -> (model, stages, loss included)
    "resnet18": ("resnet18", 11),
    "resnet50": ("resnet50", 19),
    "resnet101": ("resnet101", 36),
    "resnet152": ("resnet152", 53),
    "vgg16": ("vgg16", 15),
    "densenet121": ("densenet121", 1 + 58 + 3 + 2),  # one stage per dense layer
    "gpt-small": ("gpt-small", 15),
    "gpt2": ("hf:gpt2", 15),
    "llama-1b": ("hf:llama-1b", 19),
    "bert-base": ("hf:bert", 15),
    "vit-b-16": ("hf:vit-b-16", 15),
}


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_profiles(name):
    if name not in bundled_profiles():
        pytest.skip(f"bundled profile {name} not generated (benchmarks/make_profiles.py)")
    prof = load_profile(name)
    model, length = BUNDLED[name]
    assert prof.model == model and len(prof.stages) == length
    assert prof.device is not None and prof.device.kind == "cpu"
    assert prof.stages[-1].name == "loss"
    assert all(s.saved_size >= s.output_size > 0 for s in prof.stages)
    assert memplan.solve(prof, "store-all", memory="1TB", optimizer="none").feasible


def test_sizes_the_model_refuses_in_training_are_an_input_error():
    """BatchNorm on one value per channel (batch 1, 1x1 maps) is the input's problem: InputError."""
    with pytest.raises(
        InputError, match=r"stage \d+ \(.*\) fails in training mode: .*--batch-size"
    ):
        profile_model("resnet18", batch_size=1, input_shape=(3, 32, 32), repeats=1)


# --------------------------------------------------------------------------------------------
# Conditions, identical stages, noise, the gradients each backward creates
# --------------------------------------------------------------------------------------------


def test_a_profile_records_its_conditions_and_leaves_the_threads(gpt_tiny_profile):
    conditions = gpt_tiny_profile.measured.conditions
    assert conditions.threads == 1  # the CPU default (docs/profiling.md, "Conditions")
    assert conditions.torch == torch.__version__ and conditions.dtype == "float32"
    assert conditions.device == "cpu" and conditions.cpu and conditions.cpu_capability
    before = torch.get_num_threads()
    prof = profile_model("gpt-tiny", batch_size=1, input_shape=(8,), repeats=1, threads=2)
    assert prof.measured.conditions.threads == 2
    assert torch.get_num_threads() == before
    with pytest.raises(InputError, match="--threads"):
        profile_model("gpt-tiny", threads=0)


def test_identical_stages_are_measured_once(resnet18_profile):
    by_name = {s.name: s for s in resnet18_profile.stages}
    # layer1.0 and layer1.1 are the same block on the same shape (no downsampling in layer1);
    # every later layer's first block downsamples, its second does not
    assert by_name["layer1.1"].extra == {"same_as": "layer1.0"}
    for name in ("stem", "layer1.0", "layer2.0", "layer2.1", "layer3.0", "head", "loss"):
        assert not (by_name[name].extra or {}).get("same_as"), name
    fields = ("output_size", "saved_size", "forward_overhead", "backward_overhead", "forward_time")
    for field in (*fields, "backward_time", "weight_size", "weight_grad_size"):
        assert getattr(by_name["layer1.1"], field) == getattr(by_name["layer1.0"], field), field


def test_reuse_gives_the_sizes_a_full_measurement_gives(gpt_tiny_profile):
    full = profile_model("gpt-tiny", batch_size=2, input_shape=(16,), repeats=1, dedupe=False)
    assert all(not s.extra for s in full.stages)
    assert gpt_tiny_profile.stages[2].extra == {"same_as": "block0"}

    def sizes(prof: Profile) -> list[tuple]:
        return [
            (s.output_size, s.saved_size, s.weight_size, s.forward_overhead, s.backward_overhead,
             s.weight_grad_size, s.backward_overhead_fresh)
            for s in prof.stages
        ]  # fmt: skip

    assert sizes(full) == sizes(gpt_tiny_profile)


def test_noise_is_recorded(resnet18_profile):
    assert resnet18_profile.measured.noise is None  # one repeat: no spread to speak of
    prof = profile_model("resnet18", batch_size=2, input_shape=(3, 32, 32), repeats=3)
    noise = prof.measured.noise
    measured = [s.name for s in prof.stages if not (s.extra or {}).get("same_as")]
    assert noise is not None and noise.spread >= 0
    assert noise.outliers <= len(measured) * 3
    assert set(noise.flagged or []) <= set(measured)


def test_weight_grad_size_is_what_each_backward_creates(resnet18_profile):
    model, x, _ = build_model("resnet18", batch_size=2, input_shape=(3, 64, 64))
    chain = linearize(model, x)
    input_grad = 0  # the first stage's input (the images) has none
    for (name, module), stage in zip(chain.stages, resnet18_profile.stages, strict=True):
        params = sum(p.numel() * p.element_size() for p in module.parameters())
        assert stage.weight_grad_size == params, name
        # the peak, relative to the backward's start, is never below it; it may be below the
        # gradients it makes: a block ending in a ReLU frees its output and the output's
        # gradient with its first node (NOTE [ The backward owns what it frees ])
        assert input_grad + stage.weight_grad_size + stage.backward_overhead_fresh >= 0, name
        input_grad = stage.output_size


class _Tied(nn.Module):
    """Embedding, a block, a head tied to the embedding (as GPT-2's): the head's backward,
    the first to run, creates the shared gradient; the embedding's adds into it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.block = nn.Linear(8, 8)
        self.head = nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight

    def memplan_stages(self):
        return [("embedding", self.embed), ("block", self.block), ("head", self.head)]

    def forward(self, ids):
        return self.head(self.block(self.embed(ids)))


def test_a_tied_weight_grad_is_created_by_the_last_stage_using_it():
    ids = torch.randint(0, 32, (2, 5))
    prof = profile_model(_Tied(), example_input=ids, repeats=1, name="tied")
    embedding, block, head, loss = prof.stages
    table = 32 * 8 * F32
    assert embedding.weight_size >= table and head.weight_size == 0  # counted once, first
    assert embedding.weight_grad_size == 0 and head.weight_grad_size == table
    assert block.weight_grad_size == (8 * 8 + 8) * F32 and loss.weight_grad_size == 0
    # in the embedding's backward the shared gradient exists: its own part is a temporary
    assert embedding.backward_overhead_fresh > 0
