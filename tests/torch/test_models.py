"""The model zoo of memplan.torch and the linearization of models into chains."""

from __future__ import annotations

import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from memplan.errors import InputError  # noqa: E402
from memplan.torch.models.registry import MODELS, build_model  # noqa: E402
from memplan.torch.split.linearize import (  # noqa: E402
    ClassificationLoss,
    MeanSquareLoss,
    NextTokenLoss,
    linearize,
    split_model,
)
from memplan.torch.split.stages import outputs_match  # noqa: E402
from memplan.torch.zoo.inception import Inception3, InceptionOutputs  # noqa: E402

pytestmark = pytest.mark.torch

# torchvision's published parameter counts (torchvision.models documentation).
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg16": 138_357_544,
    "densenet121": 7_978_856,
    "mobilenet_v2": 3_504_872,
    "inception_v3": 23_834_568,  # aux_logits=False; 27,161,264 published with AuxLogits
}

# name -> (input shape for a quick check, number of chain stages, loss included)
CHAIN_LENGTHS = {
    "resnet18": ((3, 32, 32), 1 + 8 + 2),
    "resnet34": ((3, 32, 32), 1 + 16 + 2),
    "resnet50": ((3, 32, 32), 1 + 16 + 2),
    "resnet101": ((3, 32, 32), 1 + 33 + 2),
    "resnet152": ((3, 32, 32), 1 + 50 + 2),
    "vgg11": ((3, 32, 32), 8 + 2),
    "vgg16": ((3, 32, 32), 13 + 2),
    "densenet121": ((3, 32, 32), 1 + (6 + 12 + 24 + 16) + 3 + 2),  # one stage per dense layer
    "mobilenet_v2": ((3, 32, 32), 19 + 2),
    "inception_v3": ((3, 75, 75), 5 + 11 + 2),  # 75x75: the smallest input Inception v3 takes
    "gpt-tiny": ((16,), 1 + 2 + 2),
}


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_parameter_counts_match_torchvision(name):
    with torch.device("meta"):  # no memory, no initialisation cost
        model = MODELS[name]()
    assert _count(model) == TORCHVISION_PARAMS[name]


def test_inception_v3_matches_torchvision():
    with torch.device("meta"):
        with_aux = Inception3()  # torchvision's inception_v3(weights=None): aux_logits=True
        without_aux = Inception3(aux_logits=False)
    assert _count(with_aux) == 27_161_264  # torchvision's published count
    assert _count(without_aux) == 23_834_568
    assert without_aux.AuxLogits is None and not without_aux.transform_input
    assert _count(with_aux.AuxLogits) == 27_161_264 - 23_834_568
    children = [name for name, _ in with_aux.named_children()]
    assert children == [
        "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
        "Conv2d_4a_3x3", "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
        "Mixed_6c", "Mixed_6d", "Mixed_6e", "AuxLogits", "Mixed_7a", "Mixed_7b", "Mixed_7c",
        "avgpool", "dropout", "fc",
    ]  # fmt: skip
    bn = with_aux.Conv2d_1a_3x3.bn
    assert with_aux.Conv2d_1a_3x3.conv.bias is None and bn.eps == 0.001
    kinds = {name: type(getattr(with_aux, name)).__name__ for name in children}
    assert [kinds[f"Mixed_{b}"] for b in ("5b", "6a", "6e", "7a", "7c")] == [
        "InceptionA", "InceptionB", "InceptionC", "InceptionD", "InceptionE",
    ]  # fmt: skip
    assert kinds["AuxLogits"] == "InceptionAux"


def test_inception_v3_chain_and_outputs():
    model, x, _ = build_model("inception_v3", batch_size=1)
    assert tuple(x.shape) == (1, 3, 299, 299)  # Inception v3's own default image size
    assert model.AuxLogits is None
    chain = linearize(model, torch.randn(1, 3, 75, 75))
    assert chain.names == [
        "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3+maxpool1", "Conv2d_3b_1x1",
        "Conv2d_4a_3x3+maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
        "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "head", "loss",
    ]  # fmt: skip
    assert isinstance(chain.modules[-1], ClassificationLoss)
    # With the auxiliary classifier, train mode returns (logits, aux_logits) as torchvision does;
    # the chain leaves the side branch out. transform_input becomes a stage of its own.
    model = Inception3(num_classes=10, transform_input=True)
    x = torch.randn(2, 3, 75, 75)
    chain = linearize(model, x)
    assert chain.names[:2] == ["transform_input", "Conv2d_1a_3x3"] and len(chain) == 19
    assert model.training
    with torch.no_grad():
        out = model(torch.randn(2, 3, 299, 299))  # AuxLogits needs 17x17 features: 299x299
        assert isinstance(out, InceptionOutputs)
        assert out.logits.shape == out.aux_logits.shape == (2, 10)
        model.eval()
        assert model(x).shape == (2, 10)


def test_gpt_sizes():
    with torch.device("meta"):
        small = MODELS["gpt-small"]()
    cfg = small.config
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.vocab_size, cfg.seq_len) == (
        12, 768, 12, 50257, 1024,
    )  # fmt: skip
    d, v = 768, 50257
    per_block = 12 * d * d + 13 * d  # qkv, proj, fc, proj + biases + two LayerNorms
    assert _count(small) == v * d + 1024 * d + 12 * per_block + 2 * d + d * v
    names = [name for name, _ in split_model(small)]
    assert names == ["embedding", *(f"block{i}" for i in range(12)), "head"]


def test_torchvision_attribute_names():
    with torch.device("meta"):
        resnet = MODELS["resnet50"]()
        vgg = MODELS["vgg16"]()
        dense = MODELS["densenet121"]()
        mobile = MODELS["mobilenet_v2"]()
    for attr in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer4", "avgpool", "fc"):
        assert hasattr(resnet, attr)
    assert hasattr(resnet.layer1[0], "conv3") and resnet.layer1[0].downsample is not None
    assert {"features", "avgpool", "classifier"} <= {n for n, _ in vgg.named_children()}
    feature_names = [n for n, _ in dense.features.named_children()]
    assert feature_names[:4] == ["conv0", "norm0", "relu0", "pool0"]
    assert "denseblock4" in feature_names and "transition3" in feature_names
    assert feature_names[-1] == "norm5"
    assert len(mobile.features) == 19 and isinstance(mobile.classifier[1], nn.Linear)


# The deepest members of a family (resnet101/152 beside resnet50, vgg16 beside vgg11): make test-all.
LARGE = {"resnet101", "resnet152", "vgg16"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.slow] if n in LARGE else [])
        for n in sorted(CHAIN_LENGTHS)
    ],
)
def test_chain_reproduces_the_model(name):
    shape, length = CHAIN_LENGTHS[name]
    model, x, _ = build_model(name, batch_size=1, input_shape=shape)
    assert model.training
    chain = linearize(model, x, verify=False)  # compared explicitly below
    assert model.training
    assert len(chain) == length
    assert chain.names[-1] == "loss"
    assert len(set(chain.names)) == len(chain.names)
    model.eval()
    with torch.no_grad():
        logits = chain.logits(x)
        torch.testing.assert_close(logits, model(x))
        loss = chain.modules[-1](logits)
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_linearize_restores_training_flags():
    model, x, _ = build_model("resnet18", batch_size=2, input_shape=(3, 32, 32))
    model.train()
    model.layer2.eval()
    linearize(model, x)
    assert model.training and model.layer1.training
    assert not model.layer2.training and not model.layer2[0].bn1.training


def test_stage_names():
    model, x, _ = build_model("resnet18", batch_size=1, input_shape=(3, 32, 32))
    assert linearize(model, x).names == [
        "stem", "layer1.0", "layer1.1", "layer2.0", "layer2.1",
        "layer3.0", "layer3.1", "layer4.0", "layer4.1", "head", "loss",
    ]  # fmt: skip
    model, x, _ = build_model("densenet121", batch_size=1, input_shape=(3, 32, 32))
    names = linearize(model, x).names
    assert names[:3] == ["stem", "denseblock1.denselayer1", "denseblock1.denselayer2"]
    assert names[7:9] == ["transition1", "denseblock2.denselayer1"]
    assert names[-3:] == ["denseblock4.denselayer16", "head", "loss"]


def test_loss_stages():
    model, x, _ = build_model("resnet18", batch_size=2, input_shape=(3, 32, 32))
    assert isinstance(linearize(model, x).modules[-1], ClassificationLoss)
    model, x, _ = build_model("gpt-tiny", batch_size=2, input_shape=(8,))
    loss = linearize(model, x).modules[-1]
    assert isinstance(loss, NextTokenLoss)
    assert torch.equal(loss.targets[:, :-1], x[:, 1:])  # next-token targets
    assert (loss.targets[:, -1] == -100).all()
    seq = nn.Sequential(nn.Conv2d(3, 4, 3))  # output is neither logits nor token logits
    assert isinstance(linearize(seq, torch.randn(1, 3, 8, 8)).modules[-1], MeanSquareLoss)


def test_sequential_is_cut_into_its_children():
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    chain = linearize(seq, torch.randn(3, 8))
    assert chain.names == ["linear0", "relu1", "linear2", "loss"]


def test_memplan_stages_hook():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

        def memplan_stages(self):
            return [("a", nn.Sequential(self.a, nn.Tanh())), ("b", self.b)]

    assert linearize(Net(), torch.randn(2, 4)).names == ["a", "b", "loss"]


class _TwoPaths(nn.Module):
    def __init__(self):
        super().__init__()
        self.left, self.right = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        return self.left(x) * self.right(x)


def test_unknown_structure_is_an_input_error():
    with pytest.raises(InputError, match="cannot linearize _TwoPaths") as info:
        linearize(_TwoPaths(), torch.randn(2, 4))
    assert "\n" not in str(info.value)


def test_wrong_stages_are_detected():
    class Skips(_TwoPaths):
        def memplan_stages(self):
            return [("left", self.left)]  # forgets the right path

    with pytest.raises(InputError, match="does not reproduce"):
        linearize(Skips(), torch.randn(2, 4))


def test_stage_returning_a_tuple_is_an_input_error():
    class Pair(nn.Module):
        def forward(self, x):
            return x, x

    with pytest.raises(InputError, match="every stage must return one floating-point tensor"):
        linearize(nn.Sequential(nn.Linear(4, 4), Pair()), torch.randn(2, 4))


def test_bad_input_shape_is_an_input_error():
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(InputError, match="failed"):
        linearize(model, torch.randn(2, 5))


def test_build_model_inputs():
    model, x, name = build_model("gpt-tiny")
    assert name == "gpt-tiny" and x.dtype == torch.int64 and tuple(x.shape) == (4, 32)
    _, x, _ = build_model("gpt-tiny", batch_size=2, input_shape=(8,))
    assert tuple(x.shape) == (2, 8)
    with pytest.raises(InputError, match="sequence length"):
        build_model("gpt-tiny", input_shape=(64,))
    _, x, _ = build_model("mobilenet_v2", batch_size=3, input_shape=(3, 32, 32))
    assert tuple(x.shape) == (3, 3, 32, 32) and x.dtype == torch.float32
    first, _, _ = build_model("resnet18", batch_size=1, input_shape=(3, 32, 32))
    again, _, _ = build_model("resnet18", batch_size=1, input_shape=(3, 32, 32))
    assert torch.equal(first.fc.weight, again.fc.weight)  # seeded, deterministic
    with pytest.raises(InputError, match="unknown model 'resnet9000'"):
        build_model("resnet9000")


def test_build_model_from_a_factory_spec(tmp_path, monkeypatch):
    (tmp_path / "memplan_test_factories.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def plain():
                return nn.Sequential(nn.Flatten(1), nn.Linear(3 * 8 * 8, 10))

            def with_input():
                return nn.Sequential(nn.Linear(5, 2)), torch.randn(7, 5)

            def not_a_module():
                return 42
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "memplan_test_factories", raising=False)
    model, x, name = build_model(
        "memplan_test_factories:plain", batch_size=2, input_shape=(3, 8, 8)
    )
    assert isinstance(model, nn.Sequential) and tuple(x.shape) == (2, 3, 8, 8)
    assert name == "memplan_test_factories:plain"
    model, x, _ = build_model("memplan_test_factories:with_input")
    assert tuple(x.shape) == (7, 5)
    with pytest.raises(InputError, match="batch size 3 cannot be applied"):
        build_model("memplan_test_factories:with_input", batch_size=3)
    with pytest.raises(InputError, match="not an nn.Module"):
        build_model("memplan_test_factories:not_a_module")
    with pytest.raises(InputError, match="has no attribute"):
        build_model("memplan_test_factories:missing")
    with pytest.raises(InputError, match="cannot import"):
        build_model("memplan_no_such_module_xyz:factory")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [0.0, 1e-8, 1e-6, 1e-5, 1e-3, 1e-2, 0.1])
def test_outputs_match_judges_as_assert_close(dtype, scale):
    """The chain check without torch.testing (issue 14 item 7) accepts and refuses what
    assert_close does, NaN included, at and around each dtype's tolerances."""
    generator = torch.Generator().manual_seed(0)
    expected = torch.randn(64, generator=generator).to(dtype)
    expected[3] = float("nan")
    actual = (expected.double() * (1 + scale) + scale).to(dtype)
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True)
        close = True
    except AssertionError:
        close = False
    assert outputs_match(actual, expected) == close


def test_outputs_match_refuses_other_dtypes_and_shapes():
    x = torch.ones(4)
    assert not outputs_match(x.double(), x)
    assert not outputs_match(x.reshape(2, 2), x)
