"""Which model a name means: the built-in models, user factories, ``hf:`` and ``timm:`` names.

The built-in CNNs are torchvision's architectures: torchvision's own model when ``import
torchvision`` works, else memplan's copy in :mod:`memplan.torch.zoo` (the same modules layer for
layer, so that :mod:`memplan.torch.split.linearize` cuts both the same way). ``gpt-*`` are
memplan's own transformer (:mod:`memplan.torch.zoo.gpt`). No pretrained weights are involved:
memory and time do not depend on the values of the weights.

=================  ==============  ===============================================
name               parameters      architecture
=================  ==============  ===============================================
``resnet18``       11,689,512      ResNet, BasicBlock [2, 2, 2, 2]
``resnet34``       21,797,672      ResNet, BasicBlock [3, 4, 6, 3]
``resnet50``       25,557,032      ResNet, Bottleneck [3, 4, 6, 3]
``resnet101``      44,549,160      ResNet, Bottleneck [3, 4, 23, 3]
``resnet152``      60,192,808      ResNet, Bottleneck [3, 8, 36, 3]
``alexnet``        61,100,840      AlexNet (torchvision's one-GPU variant)
``vgg11``          132,863,336     VGG configuration "A", no batch norm
``vgg16``          138,357,544     VGG configuration "D", no batch norm
``densenet121``    7,978,856       DenseNet, growth 32, blocks (6, 12, 24, 16)
``mobilenet_v2``   3,504,872       MobileNetV2, width 1.0
``inception_v3``   23,834,568      Inception v3 without the auxiliary classifier (27,161,264 with)
``gpt-small``      ~163 M          12 pre-norm blocks, d_model 768, 12 heads, untied head
``gpt-tiny``       ~0.1 M          2 blocks, d_model 64, 2 heads, vocabulary 128, 32 tokens
=================  ==============  ===============================================

Examples
--------
>>> from memplan.torch.models.registry import build_model
>>> model, x, name = build_model("resnet18", batch_size=2, input_shape=(3, 64, 64))
>>> tuple(x.shape)
(2, 3, 64, 64)
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError, did_you_mean
from memplan.torch.base.blame import BUILDING, model_errors
from memplan.torch.models.hf import build_hf_model, hf_example_input, is_hf_model
from memplan.torch.zoo.densenet import DenseNet
from memplan.torch.zoo.gpt import GPT, GPTConfig
from memplan.torch.zoo.inception import Inception3
from memplan.torch.zoo.mobilenet import MobileNetV2
from memplan.torch.zoo.resnet import BasicBlock, Bottleneck, ResNet
from memplan.torch.zoo.vgg import VGG, AlexNet

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_IMAGE_SHAPE",
    "MODELS",
    "build_model",
    "example_input",
    "import_factory",
    "model_names",
]

DEFAULT_BATCH_SIZE = 32
"""Batch size of image models when none is given (transformers choose their own)."""

DEFAULT_IMAGE_SHAPE = (3, 224, 224)
"""Shape of one image sample (channels, height, width) when none is given."""


# --------------------------------------------------------------------------------------------
# Registry and construction
# --------------------------------------------------------------------------------------------

MODELS: dict[str, Callable[[], nn.Module]] = {
    "resnet18": partial(ResNet, BasicBlock, [2, 2, 2, 2]),
    "resnet34": partial(ResNet, BasicBlock, [3, 4, 6, 3]),
    "resnet50": partial(ResNet, Bottleneck, [3, 4, 6, 3]),
    "resnet101": partial(ResNet, Bottleneck, [3, 4, 23, 3]),
    "resnet152": partial(ResNet, Bottleneck, [3, 8, 36, 3]),
    "alexnet": AlexNet,
    "vgg11": partial(VGG, "A"),
    "vgg16": partial(VGG, "D"),
    "densenet121": partial(DenseNet, 32, (6, 12, 24, 16), 64),
    "mobilenet_v2": MobileNetV2,
    "inception_v3": partial(Inception3, aux_logits=False),
    "gpt-small": partial(GPT, GPTConfig()),
    "gpt-tiny": partial(
        GPT, GPTConfig(vocab_size=128, seq_len=32, n_layer=2, n_head=2, d_model=64, batch_size=4)
    ),
}
"""Name -> factory (no arguments) of every built-in model: memplan's own (:mod:`memplan.torch.zoo`)."""

TORCHVISION_OPTIONS: dict[str, dict[str, Any]] = {
    "inception_v3": {"aux_logits": False, "init_weights": True},
}
"""Keywords that make torchvision's model the same as the built-in one of that name."""

TORCHVISION_IMAGE_SHAPES: dict[str, tuple[int, ...]] = {
    "inception_v3": Inception3.memplan_image_shape,
}
"""The built-in models' default image shapes, given to torchvision's model of the same name."""


def model_names() -> list[str]:
    """The names :func:`build_model` accepts without a ``module:factory`` spec."""
    return list(MODELS)


def _torchvision_factory(name: str) -> Callable[[], nn.Module] | None:
    """A torchvision model of that name, when torchvision is installed and loads.

    Torchvision's own model is preferred to the zoo's copy of a built-in name (the same modules);
    it keeps the copy's default image shape (``memplan_image_shape``, 299x299 for Inception v3).
    """
    try:
        tv_models = importlib.import_module("torchvision.models")
    except Exception:  # not installed, or a build that does not load beside this torch
        return None
    try:
        available = set(tv_models.list_models(module=tv_models))
    except (AttributeError, TypeError):
        available = set()
    if name not in available:
        return None
    options = TORCHVISION_OPTIONS.get(name, {})
    shape = TORCHVISION_IMAGE_SHAPES.get(name)

    def build() -> nn.Module:
        model: nn.Module = tv_models.get_model(name, weights=None, **options)
        if shape is not None:
            model.memplan_image_shape = shape
        return model

    return build


TIMM_HINT = "needs timm (pip install timm), which needs a torchvision built for the installed torch"


def _timm_model(spec: str) -> nn.Module:
    """``timm:NAME``: ``timm.create_model(NAME, pretrained=False)`` (nothing is downloaded)."""
    name = spec.removeprefix("timm:")
    try:
        timm = importlib.import_module("timm")
    except Exception as exc:  # ImportError, or torchvision failing to load its operators
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(f"model {spec!r} {TIMM_HINT} ({first})") from None
    if not name:
        raise InputError(f"model {spec!r}: expected timm:NAME, e.g. timm:vit_base_patch16_224")
    try:
        model = timm.create_model(name, pretrained=False)
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or ["unknown model"])[0]
        raise InputError(f"model {spec!r}: {first}") from None
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    if isinstance(size, (tuple, list)) and len(size) == 3:
        model.memplan_image_shape = tuple(int(d) for d in size)
    return model


def _import_user_module(name: str) -> object:
    """Import the module of a ``package.module:factory`` spec, the current directory first.

    As ``python -m`` does: ``memplan profile mypkg.models:make_net`` run where ``mypkg/`` is finds
    it without ``PYTHONPATH=.`` (the ``memplan`` script's own folder is what Python puts first).
    The directory is on the import path only while the module is imported: a ``sympy.py`` or
    ``typing_extensions.py`` lying there must not stand in for the package that torch or
    transformers import later, while profiling.
    """
    cwd = os.getcwd()
    added = "" not in sys.path and cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        importlib.invalidate_caches()  # a module written after start-up (tests, notebooks) is found
        return importlib.import_module(name)
    finally:
        if added:
            with contextlib.suppress(ValueError):  # the module may have taken it off itself
                sys.path.remove(cwd)


def import_factory(spec: str) -> Callable[..., object]:
    """The callable that a ``package.module:factory`` spec names (NOTE [ whose error ] for what
    importing it may raise: :func:`build_model` and :func:`memplan.torch.models.join.resolve_join` import
    it inside :func:`~memplan.torch.base.blame.model_errors`).
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"model {spec!r}: expected package.module:factory")
    try:
        module = _import_user_module(module_name)
    except ImportError as exc:
        raise InputError(f"model {spec!r}: cannot import {module_name}: {exc}") from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise InputError(f"model {spec!r}: {module_name} has no attribute {attr!r}")
    if not callable(factory):
        raise InputError(f"model {spec!r}: {attr} is not callable")
    return factory


def example_input(
    model: nn.Module,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> Tensor:
    """A deterministic example input for ``model``.

    A model with a ``memplan_example_input(batch_size, input_shape)`` method (the transformers)
    chooses its own; any other gets ``batch_size`` random images of ``input_shape`` (by default
    the model's ``memplan_image_shape`` attribute if it has one, e.g. 3x299x299 for Inception v3,
    else :data:`DEFAULT_IMAGE_SHAPE`).

    Parameters
    ----------
    model : nn.Module
        The model the input is for.
    batch_size : int, optional
        Samples; :data:`DEFAULT_BATCH_SIZE` for images when omitted.
    input_shape : tuple of int, optional
        Shape of one sample; ``model.memplan_image_shape`` or :data:`DEFAULT_IMAGE_SHAPE` for
        images when omitted.

    Returns
    -------
    Tensor
        Float images ``(batch, *input_shape)`` or the model's own input (token ids).
    """
    if batch_size is not None and batch_size < 1:
        raise InputError(f"batch size {batch_size}: expected a positive integer")
    if input_shape is not None and (not input_shape or any(d < 1 for d in input_shape)):
        raise InputError(f"input shape {input_shape}: expected positive integers, e.g. 3,224,224")
    own = getattr(model, "memplan_example_input", None)
    if callable(own):
        return own(batch_size, input_shape)
    if is_hf_model(model):
        return hf_example_input(model, batch_size, input_shape)
    batch = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    default_shape = tuple(getattr(model, "memplan_image_shape", DEFAULT_IMAGE_SHAPE))
    shape = default_shape if input_shape is None else tuple(input_shape)
    generator = torch.Generator().manual_seed(0)
    return torch.randn((batch, *shape), generator=generator)


def build_model(
    spec: str,
    *,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    seed: int = 0,
    config: str | dict[str, Any] | None = None,
) -> tuple[nn.Module, Tensor, str]:
    """Build a model and an example input from a name or a ``package.module:factory`` spec.

    Parameters
    ----------
    spec : str
        A name of :data:`MODELS` (``resnet50``, ``gpt-small``), ``hf:NAME`` (a Hugging Face
        ``transformers`` model built from its config class, :mod:`memplan.torch.models.hf`),
        ``timm:NAME`` (a timm model, when timm is installed), a torchvision model name when
        torchvision is installed, or ``package.module:factory`` where ``factory()`` returns an
        ``nn.Module`` or a tuple ``(module, example_input)``.
    batch_size : int, optional
        Batch size of the example input (see :func:`example_input`).
    input_shape : tuple of int, optional
        Shape of one sample: ``(3, 224, 224)`` for images, ``(seq,)`` for transformers.
    seed : int
        Seed of the weight initialisation (the global RNG state is left untouched).
    config : str or dict, optional
        Config values of an ``hf:`` model (``"n_layer=24,n_embd=1024"``).

    Returns
    -------
    tuple
        ``(model, example_input, name)``, the model on the CPU in float32.

    Raises
    ------
    InputError
        Unknown name, unimportable factory, a factory returning something else, or any error
        that the model's own code raises while it is built (a factory's ``ValueError``, a config
        the model rejects): NOTE [ whose error ] in :mod:`memplan.torch.base.blame`.
    """
    given = ""
    if config:
        text = (
            config if isinstance(config, str) else ",".join(f"{k}={v}" for k, v in config.items())
        )
        given = f" with --config {text}"
    with model_errors(spec, BUILDING, given):
        return _build_model(spec, batch_size, input_shape, seed, config)


def _build_model(
    spec: str,
    batch_size: int | None,
    input_shape: tuple[int, ...] | None,
    seed: int,
    config: str | dict[str, Any] | None,
) -> tuple[nn.Module, Tensor, str]:
    if spec.startswith("hf:"):
        return build_hf_model(
            spec, config, batch_size=batch_size, input_shape=input_shape, seed=seed
        )
    if config:
        raise InputError(f"--config: only hf: models take config values (not {spec!r})")
    given: Tensor | None = None
    if spec in MODELS:
        factory: Callable[[], object] = _torchvision_factory(spec) or MODELS[spec]
    elif spec.startswith("timm:"):
        factory = partial(_timm_model, spec)
    elif ":" in spec:
        factory = import_factory(spec)
    else:
        tv_factory = _torchvision_factory(spec)
        if tv_factory is None:
            raise InputError(
                f"unknown model {spec!r}{did_you_mean(spec, MODELS)}; choose one of "
                f"{', '.join(MODELS)}, hf:NAME (e.g. hf:gpt2), timm:NAME, or give "
                "package.module:factory"
            )
        factory = tv_factory
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        built = factory()
    if isinstance(built, tuple):
        if len(built) != 2 or not isinstance(built[1], Tensor):
            raise InputError(f"model {spec!r}: the factory must return a module or (module, input)")
        built, given = built
    if not isinstance(built, nn.Module):
        raise InputError(
            f"model {spec!r}: the factory returned {type(built).__name__}, not an nn.Module"
        )
    if given is not None:
        if batch_size is not None and given.shape[0] != batch_size:
            raise InputError(
                f"model {spec!r}: its factory gives an input of batch {given.shape[0]}; "
                f"batch size {batch_size} cannot be applied"
            )
        if input_shape is not None and tuple(given.shape[1:]) != tuple(input_shape):
            raise InputError(
                f"model {spec!r}: its factory gives an input of shape "
                f"{','.join(map(str, given.shape[1:]))}; input shape "
                f"{','.join(map(str, input_shape))} cannot be applied"
            )
        return built, given, spec
    return built, example_input(built, batch_size, input_shape), spec
