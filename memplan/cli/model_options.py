"""What the commands that build a model share (``profile``, ``bench``, ``run``): their options,
declared once, and the checks of those options that run before torch is imported.

An option the three declare alike is an ``Annotated`` alias (``batch_size: BatchSizeOption = None``);
one whose help differs by command keeps the shared part here (:data:`LOSS_CHUNKS_HELP`). The
options of the solvers' families (``--slots``, ``--bandwidth``, ...) are declared by the families
themselves (:mod:`memplan.cli.options`).
"""

import enum
import importlib.util
from typing import Annotated

import typer

from memplan.errors import InputError
from memplan.units import parse_config

TORCH_HINT = "needs the torch extra: pip install 'memplan[torch]'"
MODEL_NAMES = (
    "resnet18, resnet34, resnet50, resnet101, resnet152, alexnet, vgg11, vgg16, densenet121, "
    "mobilenet_v2, inception_v3, gpt-small, gpt-tiny"
)
"""The built-in models, for --help without importing torch (tests/cli/test_docs.py checks them
against :data:`memplan.torch.models.registry.MODELS`)."""
JOIN_NAMES = "siamese-resnet18, cross-modal-resnet18, tiny-join"
"""The built-in join networks (:data:`memplan.torch.models.join.JOIN_MODELS`)."""
MODEL_HELP = (
    f"A built-in model ({MODEL_NAMES}), a join network ({JOIN_NAMES}), hf:NAME (Hugging Face: "
    "hf:gpt2, hf:llama-1b, hf:bert, hf:vit..., the hf extra), timm:NAME, package.module:factory "
    "(a factory of yours, found from the current directory as with python -m), or a torchvision "
    "model name when torchvision is installed."
)
CONFIG_HELP = (
    "Config values of an hf: model, e.g. n_layer=24,n_embd=1024 (names of its transformers "
    "config class)."
)
TrainingOptimizerOption = Annotated[
    str,
    typer.Option(
        metavar="NAME[:STEP]",
        help="The optimizer trained with and counted in the budget, its state and its step: "
        "sgd, momentum, adam, adamw; with the step, adamw:fused, adam:foreach (default: "
        "PyTorch's; none: SGD, the budget for the activations alone).",
    ),
]
LOSS_CHUNKS_HELP = (
    "A language model's head and loss as one stage computed in N chunks of tokens (hf: causal "
    "and masked LMs, the built-in GPTs): no step holds more than one chunk's logits; the same "
    "loss and gradients. What you lose: the full logits are never made (the chain returns the "
    "loss alone)."
)
"""``--loss-chunks``' help; each command adds what the option does there."""


class DeviceChoice(str, enum.Enum):
    """``--device``: where a model is profiled or trained."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class DType(str, enum.Enum):
    """``--dtype``: the data type of a model's weights and activations."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


ModelArgument = Annotated[str, typer.Argument(metavar="MODEL", help=MODEL_HELP)]
"""MODEL of ``profile`` and ``bench``."""
BatchSizeOption = Annotated[
    int | None,
    typer.Option("--batch-size", "-b", metavar="N", help="Batch size.  [default: the model's]"),
]
"""``--batch-size`` of ``bench`` and ``run`` (``profile`` says its defaults)."""
InputShapeOption = Annotated[
    str | None,
    typer.Option(metavar="C,H,W", help="Shape of one sample.  [default: the model's]"),
]
"""``--input-shape`` of ``bench`` and ``run`` (``profile`` says its defaults)."""
ConfigOption = Annotated[
    str | None, typer.Option("--config", metavar="NAME=VALUE,...", help=CONFIG_HELP)
]
"""``--config`` of ``profile``, ``bench`` and ``run``."""
TrainingDeviceOption = Annotated[DeviceChoice, typer.Option(help="Where to train.")]
"""``--device`` of ``bench`` and ``run``."""
ProfilerRepeatsOption = Annotated[int, typer.Option(metavar="N", help="Profiler repetitions.")]
"""``--repeats`` of ``bench`` and ``run`` (``profile``'s is optional: timed repetitions)."""


def has_torch() -> bool:
    """Whether PyTorch is installed (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


def check_counts(*options: tuple[str, int | None]) -> None:
    """A usage error for the first ``(flag, value)`` given below 1 (``--steps 0``)."""
    for option, value in options:
        if value is not None and value < 1:
            raise InputError(f"{option} {value}: expected a positive integer")


def parse_shape(text: str) -> tuple[int, ...]:
    """``3,224,224`` (or ``3x224x224``) -> ``(3, 224, 224)``."""
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise InputError(
            f"--input-shape {text!r}: expected positive integers separated by commas, "
            "e.g. 3,224,224"
        ) from None
    if not shape or any(d <= 0 for d in shape):
        raise InputError(f"--input-shape {text!r}: expected positive integers, e.g. 3,224,224")
    return shape


def parse_config_option(model: str, text: str | None) -> str | None:
    """Check ``--config n_layer=24,n_embd=1024`` before torch is imported; the text, or None.

    Raises
    ------
    InputError
        A malformed list, or values for a model that is not ``hf:``.
    """
    if text is None:
        return None
    values = parse_config(text)
    if values and not model.startswith("hf:"):
        raise InputError(f"--config: only hf: models take config values (not {model!r})")
    return text if values else None
