"""``--estimate`` on fake tensors (memplan.torch.measure.fake): a real CPU run's sizes, without computing.

The sizes an estimated profile holds (``output_size``, ``saved_size``, ``weight_size``,
``grad_size``, ``input_size``) must be byte for byte a real CPU profile's, and its operator counts
(hence its times) those of the real-tensor estimate (``--device cpu``). The overheads are measured
at the tensor level (NOTE [ fake overheads ]): the same on fake and on real tensors, and equal to
the CPU allocator's where no kernel allocates buffers of its own.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from memplan.errors import InputError  # noqa: E402
from memplan.torch.estimate.roofline import OpCounter  # noqa: E402
from memplan.torch.measure.fake import OVERHEADS_METHOD, TensorLevelRun  # noqa: E402
from memplan.torch.measure.stage import measure_stage  # noqa: E402
from memplan.torch.models.registry import build_model  # noqa: E402
from memplan.torch.profiler.chain import linearize_on_sample, training_state  # noqa: E402
from memplan.torch.profiler.model import profile_model  # noqa: E402
from memplan.torch.split.linearize import linearize  # noqa: E402

pytestmark = pytest.mark.torch

F32 = 4
SIZES = ("name", "output_size", "saved_size", "weight_size", "grad_size")
COUNTS = ("forward_time", "backward_time", "extra")


class _Branchy(nn.Module):
    """A stage with a temporary that dies inside the forward (the overhead the tracker sees)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.a(x) + self.b(x))


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16),
        nn.BatchNorm1d(16),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        _Branchy(),
        nn.Flatten(),  # a view of its input
        nn.Linear(16, 4),
    )
    return model, torch.randn(6, 8)


MODELS = {  # name -> profile_model arguments (benchmarks/bench_profile.py --check checks more)
    "resnet18": {"batch_size": 2, "input_shape": (3, 32, 32)},
    "gpt-tiny": {"batch_size": 2, "input_shape": (16,)},
}


def _profiles(name: str) -> tuple:
    if name == "mlp":
        model, x = _mlp()
        args = {"example_input": x, "name": "mlp"}
    else:
        model, args = name, MODELS[name]
    fake = profile_model(model, estimate="a100", **args)
    real = profile_model(model, estimate="a100", device="cpu", **args)
    measured = profile_model(model, repeats=1, **args)
    return fake, real, measured


@pytest.mark.parametrize("name", [*MODELS, "mlp"])
def test_fake_estimate_has_the_real_sizes_and_counts(name):
    fake, real, measured = _profiles(name)
    assert fake.measured.estimate["sizes_on"] == "fake"
    assert fake.measured.extra["overheads"] == OVERHEADS_METHOD
    assert "fake_failed" not in fake.measured.estimate
    assert real.measured.estimate["sizes_on"] == "cpu"
    assert fake.input_size == real.input_size == measured.input_size
    assert len(fake.stages) == len(real.stages) == len(measured.stages)
    for f, r, m in zip(fake.stages, real.stages, measured.stages, strict=True):
        assert [getattr(f, k) for k in SIZES] == [getattr(m, k) for k in SIZES], f.name
        assert [getattr(f, k) for k in SIZES] == [getattr(r, k) for k in SIZES], f.name
        assert [getattr(f, k) for k in COUNTS] == [getattr(r, k) for k in COUNTS], f.name
    assert fake.bandwidth == real.bandwidth  # the GPU's host link


def _tensor_level(chain, x, fake: bool) -> list[tuple[int, ...]]:
    run = TensorLevelRun(fake=fake)
    x = run.fake(x)
    found = []
    with training_state(chain.modules), torch.enable_grad():
        for k, (_, module) in enumerate(chain.stages):
            m = run.measure_stage(module, x, input_grad=k > 0, counter=OpCounter())
            found.append(
                (m.output_size, m.grad_size, m.saved_size, m.forward_overhead, m.backward_overhead)
            )
            x = m.output
    return found


@pytest.mark.parametrize("name", ["resnet18", "gpt-tiny", "mlp"])
def test_tensor_level_overheads_are_the_same_on_fake_and_real_tensors(name):
    if name == "mlp":
        model, x = _mlp()
    else:
        torch.manual_seed(0)
        model, x, _ = build_model(name, **MODELS[name])
    chain = linearize(model, x)
    fake, real = _tensor_level(chain, x, True), _tensor_level(chain, x, False)
    assert fake == real
    if name == "mlp":  # the branchy stage: a(x) and b(x) are temporaries (16 floats per row)
        branchy = fake[4]
        assert branchy[3] == 2 * 6 * 16 * F32  # a(x), b(x) live together, then their sum


def test_overheads_match_the_allocator_where_kernels_allocate_nothing():
    """exp(sin(x)) on 32 x 32 floats, N = 4 KiB each. The forward makes sin(x) (a temporary) and
    its exp (kept for the backward: saved): peak 2N, overhead N. The backward makes the gradient
    of sin(x) (N), then cos(x) and the input gradient (N each): peak 3N, overhead 2N beyond the
    input gradient. The real CPU allocator (torch.profiler, a normal profile) sees the same: no
    kernel here allocates anything but its result (a Python number would: ``x * 2`` allocates
    the 2 as a tensor, which the operator-level count does not see)."""

    class ExpSin(nn.Module):
        def forward(self, x):
            return torch.exp(torch.sin(x))

    x = torch.randn(32, 32)
    n = 32 * 32 * F32
    stage = ExpSin()
    expected = (n, n, n, 2 * n)
    for fake in (True, False):
        run = TensorLevelRun(fake=fake)
        m = run.measure_stage(stage, run.fake(x), input_grad=True)
        found = (m.output_size, m.saved_size, m.forward_overhead, m.backward_overhead)
        assert found == expected, fake
    # The real CPU run measures the forward as the runtime runs it, in torch.random.fork_rng:
    # the forked CPU RNG state (host memory on a GPU, so not in the fake estimate) counts too.
    real = measure_stage(stage, x, input_grad=True, repeats=1)
    rng = torch.get_rng_state().numel()
    assert (real.output_size, real.saved_size, real.forward_overhead, real.backward_overhead) == (
        n,
        n,
        n + rng,
        2 * n,
    )


def test_fake_estimate_leaves_the_model_untouched():
    model, x = _mlp()
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile_model(model, example_input=x, estimate="a100")
    assert not model.training and all(p.grad is None for p in model.parameters())
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


class _DataDependent(nn.Module):
    """Reads a value (``.item()``): fake tensors have none, a real CPU run is needed."""

    def forward(self, x):
        return x * float(x.abs().max().item() > 0)


def test_a_model_fake_tensors_cannot_run_falls_back_to_real_tensors():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), _DataDependent(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    prof = profile_model(model, example_input=x, estimate="a100")
    estimate = prof.measured.estimate
    assert estimate["sizes_on"] == "cpu" and "fake_failed" in estimate
    assert "\n" not in estimate["fake_failed"]
    real = profile_model(model, example_input=x, estimate="a100", device="cpu")
    assert [s.saved_size for s in prof.stages] == [s.saved_size for s in real.stages]
    assert [s.forward_time for s in prof.stages] == [s.forward_time for s in real.stages]


def test_a_model_that_fails_in_training_is_still_an_input_error():
    with pytest.raises(InputError, match="fails in training mode"):
        profile_model("resnet18", batch_size=1, input_shape=(3, 32, 32), estimate="a100")


# --------------------------------------------------------------------------- linearize_on_sample


@pytest.mark.parametrize("name", ["resnet18", "gpt-tiny"])
def test_linearize_on_sample_builds_the_whole_batch_chain(name):
    torch.manual_seed(0)
    model, x, _ = build_model(name, batch_size=5, input_shape=MODELS[name]["input_shape"])
    whole, sampled = linearize(model, x), linearize_on_sample(model, x)
    assert whole.names == sampled.names
    for (_, a), (_, b) in zip(whole.stages[:-1], sampled.stages[:-1], strict=True):
        assert [id(p) for p in a.parameters()] == [id(p) for p in b.parameters()]
    loss, other = whole.stages[-1][1], sampled.stages[-1][1]
    assert type(loss) is type(other)
    assert all(torch.equal(a, b) for a, b in zip(loss.buffers(), other.buffers(), strict=True))
    with torch.no_grad():
        assert torch.equal(whole.forward(x), sampled.forward(x))


def test_linearize_on_sample_still_checks_the_chain():
    class Skips(nn.Sequential):
        def forward(self, x):  # the model adds its input back: the chain of children does not
            return super().forward(x) + x

    model = Skips(nn.Linear(4, 4), nn.Tanh())
    with pytest.raises(InputError, match="does not reproduce"):
        linearize_on_sample(model, torch.randn(8, 4))


def test_linearize_on_sample_checks_a_squeezing_model_on_the_whole_batch():
    class Squeeze(nn.Module):
        def forward(self, x):
            return x.squeeze()  # (1, 1) -> (): the sample's output has no batch dimension

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 1), Squeeze()), torch.randn(8, 4)
    whole, sampled = linearize(model, x), linearize_on_sample(model, x)
    assert type(whole.stages[-1][1]) is type(sampled.stages[-1][1])
    with torch.no_grad():
        assert torch.equal(whole.forward(x), sampled.forward(x))
