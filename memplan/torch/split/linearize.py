"""Cut a model into a chain of stages ``x_0 -> stage_0 -> x_1 -> ... -> stage_{L-1} = loss``.

The chain algorithms need a sequence of stages, each reading exactly one tensor (the previous
stage's output) and writing one tensor. :func:`split_model` knows how to cut

* ResNets (torchvision layout): ``stem`` (conv1, bn1, relu, maxpool), one stage per residual
  block (``layer1.0`` ...), ``head`` (avgpool, flatten, fc);
* DenseNets: ``stem``, one stage per dense layer and per transition, ``head`` (norm5, relu,
  pooling, classifier): a dense layer reads the concatenation of the features before it and adds
  its own, so the state passed between stages is the concatenation so far
  (:class:`DenseLayerStage`: ``x -> cat([x, layer(x)], 1)``), which grows along the block;
* Inception v3 (torchvision layout): one stage per stem convolution with the max pooling that
  follows it (``Conv2d_1a_3x3`` ... ``Conv2d_4a_3x3+maxpool2``), one per ``Mixed_*`` block,
  ``head`` (avgpool, dropout, flatten, fc); the auxiliary classifier, a train-mode side branch,
  is not part of the chain (build the model with ``aux_logits=False``);
* ``features``/``classifier`` networks (VGG, AlexNet, MobileNetV2): when ``features`` holds bare
  convolutions (VGG) one stage per convolution with the activation and pooling that follow it
  (``features.0-1``), otherwise one stage per child of ``features`` (MobileNetV2's blocks), then
  ``head`` (pooling, flatten, classifier);
* any module with a ``memplan_stages()`` method returning ``[(name, module), ...]`` (the built-in
  GPT: ``embedding``, ``block0`` ..., ``head``);
* any ``nn.Sequential``: its children;
* Hugging Face ``transformers`` models (:mod:`memplan.torch.models.hf`) and any other model made of a
  run of repeated blocks (:mod:`memplan.torch.split.repeated`): ``embedding``/``stem``, one stage per
  block, ``head``, found by tracing the forward once (this needs the example input).

:func:`linearize` appends the loss stage and checks, with the model in eval mode, that running
the chain gives the model's output.

Examples
--------
>>> from memplan.torch.models.registry import build_model
>>> model, x, _ = build_model("resnet18", batch_size=1, input_shape=(3, 32, 32))
>>> chain = linearize(model, x)
>>> chain.names[:3], chain.names[-2:], len(chain)
(['stem', 'layer1.0', 'layer1.1'], ['head', 'loss'], 11)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.torch.models.hf import is_hf_model
from memplan.torch.split.hf import hf_loss, hf_stages
from memplan.torch.split.repeated import find_repeated_blocks
from memplan.torch.split.stages import (
    eval_mode,
    first_line,
    output_mismatch,
    run_stages,
)
from memplan.torch.zoo.inception import inception_transform_input

__all__ = [
    "Chain",
    "ClassificationLoss",
    "DenseLayerStage",
    "MeanSquareLoss",
    "NextTokenLoss",
    "linearize",
    "make_loss",
    "split_model",
]

IGNORE_INDEX = -100


class ClassificationLoss(nn.Module):
    """Cross-entropy of ``(batch, classes)`` logits against fixed targets.

    Parameters
    ----------
    targets : Tensor
        Class indices, shape ``(batch,)``; kept as a non-persistent buffer.
    """

    def __init__(self, targets: Tensor) -> None:
        super().__init__()
        self.register_buffer("targets", targets, persistent=False)

    def forward(self, logits: Tensor, targets: Tensor | None = None) -> Tensor:
        """The loss against ``targets`` (the batch's labels) or the fixed ones."""
        return F.cross_entropy(logits, self.targets if targets is None else targets)


def next_tokens(tokens: Tensor) -> Tensor:
    """The targets of next-token prediction: ``tokens`` shifted left, the last one ignored."""
    targets = tokens.roll(-1, dims=-1).clone()
    targets[..., -1] = IGNORE_INDEX
    return targets


class NextTokenLoss(nn.Module):
    """Language-model cross-entropy: position ``t`` predicts token ``t + 1``.

    The last position has no target (``ignore_index``), so the logits are used whole, as a view,
    without the copy that slicing ``logits[:, :-1]`` would make.

    Parameters
    ----------
    tokens : Tensor
        The input token ids, shape ``(batch, seq)``.
    from_input : bool
        The targets are the chain's input (no labels were given): a
        :class:`~memplan.torch.CheckpointedChain` called without targets predicts the tokens of
        the batch it is called on.
    """

    def __init__(self, tokens: Tensor, from_input: bool = False) -> None:
        super().__init__()
        self.register_buffer("targets", next_tokens(tokens), persistent=False)
        self.labels_from_input = from_input

    def follow_input(self, tokens: Tensor) -> None:
        """Predict the tokens of this batch from now on (in place when the shape is the same:
        the targets stay the buffer the profile counted).
        """
        targets = next_tokens(tokens)
        if targets.shape == self.targets.shape:
            self.targets.copy_(targets)
        else:
            self.targets = targets

    def forward(self, logits: Tensor, tokens: Tensor | None = None) -> Tensor:
        """The loss of predicting ``tokens`` (the batch's, shifted here) or the fixed targets."""
        targets = self.targets if tokens is None else next_tokens(tokens)
        flat = logits.reshape(-1, logits.shape[-1])
        return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX)


class MeanSquareLoss(nn.Module):
    """A stand-in loss for outputs that are neither logits nor token logits: ``mean(x^2) / 2``."""

    def forward(self, x: Tensor, target: Tensor | None = None) -> Tensor:
        """``mean(x^2) / 2``, or ``mean((x - target)^2) / 2`` with a target."""
        if target is not None:
            x = x - target
        return x.square().mean() * 0.5


def make_loss(
    output: Tensor, example_input: Tensor, seed: int = 0, labels: Tensor | None = None
) -> nn.Module:
    """Choose the loss stage for a model's output.

    Parameters
    ----------
    output : Tensor
        The model's output on ``example_input``.
    example_input : Tensor
        The chain input.
    seed : int
        Seed of the random classification targets.
    labels : Tensor, optional
        The targets, as a Hugging Face model takes them: ``(batch, seq)`` token ids for language
        models (shifted inside the loss: position ``t`` predicts ``labels[t + 1]``), ``(batch,)``
        class indices for classifiers. Default: the input tokens, or random classes.

    Returns
    -------
    nn.Module
        :class:`NextTokenLoss` for ``(batch, seq, vocab)`` logits of ``(batch, seq)`` token ids,
        :class:`ClassificationLoss` for ``(batch, classes)`` logits, :class:`MeanSquareLoss`
        otherwise.

    Raises
    ------
    InputError
        ``labels`` of the wrong shape, or given for an output that has no labelled loss.
    """
    if (
        output.dim() == 3
        and not example_input.is_floating_point()
        and tuple(example_input.shape) == tuple(output.shape[:2])
    ):
        tokens = example_input if labels is None else labels
        if tuple(tokens.shape) != tuple(output.shape[:2]):
            raise InputError(f"labels: expected shape {tuple(output.shape[:2])}")
        return NextTokenLoss(tokens.to(output.device), from_input=labels is None)
    if output.dim() == 2 and output.shape[1] > 0:
        if labels is None:
            generator = torch.Generator().manual_seed(seed)
            labels = torch.randint(0, output.shape[1], (output.shape[0],), generator=generator)
        if tuple(labels.shape) != (output.shape[0],):
            raise InputError(f"labels: expected shape ({output.shape[0]},)")
        return ClassificationLoss(labels.to(output.device))
    if labels is not None:
        raise InputError(
            f"labels: the model's output {tuple(output.shape)} is neither token logits nor "
            "class logits; its loss stage takes no labels"
        )
    return MeanSquareLoss()


@dataclass
class Chain:
    """A linearized model: ``stages[k]`` maps x_k to x_{k+1}; the last stage is the loss.

    Attributes
    ----------
    stages : list of (str, nn.Module)
        Named stages in forward order. They share their parameters with the original model.
    inplace : list of bool
        ``inplace[k]``: stage ``k`` modified its input in place when the chain was checked (the
        runtime then runs it on a copy of an input it keeps for a recomputation); empty when
        not checked.
    """

    stages: list[tuple[str, nn.Module]]
    inplace: list[bool] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """Stage names in forward order."""
        return [name for name, _ in self.stages]

    @property
    def modules(self) -> list[nn.Module]:
        """Stage modules in forward order."""
        return [module for _, module in self.stages]

    def __len__(self) -> int:
        return len(self.stages)

    def forward(self, x: Tensor, stop: int | None = None) -> Tensor:
        """Run stages ``0 .. stop-1`` (all of them, loss included, by default)."""
        for _, module in self.stages[:stop]:
            x = module(x)
        return x

    def logits(self, x: Tensor) -> Tensor:
        """Run every stage but the loss: the model's output."""
        return self.forward(x, stop=len(self.stages) - 1)


def _resnet_stages(model: nn.Module) -> list[tuple[str, nn.Module]]:
    stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
    stages: list[tuple[str, nn.Module]] = [("stem", stem)]
    for i in range(1, 5):
        for j, block in enumerate(getattr(model, f"layer{i}")):
            stages.append((f"layer{i}.{j}", block))
    stages.append(("head", nn.Sequential(model.avgpool, nn.Flatten(1), model.fc)))
    return stages


class DenseLayerStage(nn.Module):
    """One DenseNet layer on the concatenation of the features before it, as a chain stage:
    ``x -> cat([x, new], 1)`` with ``new = conv2(relu2(norm2(conv1(relu1(norm1(x))))))``
    (then dropout when the layer has a ``drop_rate``, as torchvision's ``_DenseLayer``).

    The layer's own forward concatenates a list of tensors first; the stage reads the
    concatenation already made, so no copy of it is made (torchvision's ``torch.cat([x], 1)``
    would copy it).
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        layer = self.layer
        new = layer.conv1(layer.relu1(layer.norm1(x)))
        new = layer.conv2(layer.relu2(layer.norm2(new)))
        drop = float(getattr(layer, "drop_rate", 0.0) or 0.0)
        if drop > 0:
            new = F.dropout(new, p=drop, training=layer.training)
        return torch.cat([x, new], 1)


_DENSE_LAYER_PARTS = ("norm1", "relu1", "conv1", "norm2", "relu2", "conv2")


def _dense_block_stages(name: str, block: nn.Module) -> list[tuple[str, nn.Module]]:
    """One stage per dense layer, or the whole block when its layers are not DenseNet-BC's."""
    layers = list(block.named_children())
    if not layers or not all(_has(layer, *_DENSE_LAYER_PARTS) for _, layer in layers):
        return [(name, block)]
    return [(f"{name}.{layer_name}", DenseLayerStage(layer)) for layer_name, layer in layers]


def _densenet_stages(model: nn.Module) -> list[tuple[str, nn.Module]]:
    children = list(model.features.named_children())
    kinds = [name.startswith(("denseblock", "transition")) for name, _ in children]
    first = kinds.index(True)
    last = len(kinds) - 1 - kinds[::-1].index(True)
    stages: list[tuple[str, nn.Module]] = []
    if first > 0:
        stages.append(("stem", nn.Sequential(*(m for _, m in children[:first]))))
    for name, module in children[first : last + 1]:
        if name.startswith("denseblock"):
            stages += _dense_block_stages(name, module)
        else:
            stages.append((name, module))
    trailing = [m for _, m in children[last + 1 :]]
    head = nn.Sequential(
        *trailing,
        nn.ReLU(inplace=bool(trailing)),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(1),
        model.classifier,
    )
    stages.append(("head", head))
    return stages


def _features_stages(model: nn.Module) -> list[tuple[str, nn.Module]]:
    children = list(model.features.named_children())
    stages: list[tuple[str, nn.Module]] = []
    if any(isinstance(m, nn.Conv2d) for _, m in children):
        groups: list[list[tuple[str, nn.Module]]] = []
        for name, module in children:
            if isinstance(module, nn.Conv2d) or not groups:
                groups.append([])
            groups[-1].append((name, module))
        for group in groups:
            first, last = group[0][0], group[-1][0]
            label = f"features.{first}" if first == last else f"features.{first}-{last}"
            stages.append((label, nn.Sequential(*(m for _, m in group))))
    else:
        stages = [(f"features.{name}", module) for name, module in children]
    pool = getattr(model, "avgpool", None)
    if not isinstance(pool, nn.Module):
        pool = nn.AdaptiveAvgPool2d((1, 1))
    stages.append(("head", nn.Sequential(pool, nn.Flatten(1), model.classifier)))
    return stages


class _InceptionTransformInput(nn.Module):
    """Inception v3's ``transform_input`` as a stage (ImageNet statistics to [-1, 1])."""

    def forward(self, x: Tensor) -> Tensor:
        return inception_transform_input(x)


_INCEPTION_STEM = (
    ("Conv2d_1a_3x3", None),
    ("Conv2d_2a_3x3", None),
    ("Conv2d_2b_3x3", "maxpool1"),
    ("Conv2d_3b_1x1", None),
    ("Conv2d_4a_3x3", "maxpool2"),
)
_INCEPTION_BLOCKS = tuple(
    f"Mixed_{b}" for b in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c")
)


def _inception_stages(model: nn.Module) -> list[tuple[str, nn.Module]]:
    stages: list[tuple[str, nn.Module]] = []
    if getattr(model, "transform_input", False) is True:
        stages.append(("transform_input", _InceptionTransformInput()))
    for conv, pool_name in _INCEPTION_STEM:
        if pool_name is None:
            stages.append((conv, getattr(model, conv)))
            continue
        pool = getattr(model, pool_name, None)
        if not isinstance(pool, nn.Module):  # torchvision < 0.8 pooled functionally
            pool = nn.MaxPool2d(kernel_size=3, stride=2)
        stages.append((f"{conv}+{pool_name}", nn.Sequential(getattr(model, conv), pool)))
    # AuxLogits (train mode only) reads Mixed_6e's output off the chain: it is left out.
    stages += [(name, getattr(model, name)) for name in _INCEPTION_BLOCKS]
    pool = getattr(model, "avgpool", None)
    if not isinstance(pool, nn.Module):
        pool = nn.AdaptiveAvgPool2d((1, 1))
    dropout = getattr(model, "dropout", None)
    head = [pool, *([dropout] if isinstance(dropout, nn.Module) else []), nn.Flatten(1), model.fc]
    stages.append(("head", nn.Sequential(*head)))
    return stages


def _sequential_stages(model: nn.Sequential) -> list[tuple[str, nn.Module]]:
    return [
        (f"{type(m).__name__.lower()}{name}" if name.isdigit() else name, m)
        for name, m in model.named_children()
    ]


def _has(model: nn.Module, *names: str) -> bool:
    return all(isinstance(getattr(model, name, None), nn.Module) for name in names)


@dataclass
class _Split:
    """What a cut gives: the stages, the chain's output when already checked against the
    model's (the traced cuts), and the loss stage when the model's kind fixes it (HF models).
    """

    stages: list[tuple[str, nn.Module]]
    output: Tensor | None = None
    loss: nn.Module | None = None
    inplace: list[bool] = field(default_factory=list)


def _custom_stages(model: nn.Module, kind: str) -> list[tuple[str, nn.Module]]:
    stages = list(model.memplan_stages())
    if not all(
        isinstance(s, tuple) and len(s) == 2 and isinstance(s[1], nn.Module) for s in stages
    ):
        raise InputError(f"{kind}.memplan_stages(): expected a list of (name, nn.Module)")
    return [(str(name), module) for name, module in stages]


def _kind(model: nn.Module) -> str:
    """How :func:`_split` cuts ``model``: ``custom``, ``hf``, ``resnet``, ``inception``,
    ``densenet``, ``features``, ``sequential`` or ``repeated``.
    """
    if callable(getattr(model, "memplan_stages", None)):
        return "custom"
    if is_hf_model(model):
        return "hf"
    if _has(model, "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4",
            "avgpool", "fc"):  # fmt: skip
        return "resnet"
    if _has(model, *(conv for conv, _ in _INCEPTION_STEM), *_INCEPTION_BLOCKS, "fc"):
        return "inception"
    if _has(model, "features", "classifier") and isinstance(model.features, nn.Sequential):
        names = [name for name, _ in model.features.named_children()]
        return "densenet" if any(name.startswith("denseblock") for name in names) else "features"
    if isinstance(model, nn.Sequential):
        return "sequential"
    return "repeated"


def traces_its_input(model: nn.Module) -> bool:
    """Whether the chain of ``model`` is found by tracing it on an input (Hugging Face models, the
    generic repeated-block cut): its stages then hold what the trace saw (attention masks, position
    ids, shapes) and serve inputs of that shape only.
    """
    return _kind(model) in ("hf", "repeated")


def _split(model: nn.Module, example_input: Tensor | None, labels: Tensor | None = None) -> _Split:
    kind = type(model).__name__
    how = _kind(model)
    if how == "custom":
        return _Split(_custom_stages(model, kind))
    if how == "hf":
        if example_input is None:
            raise InputError(f"cannot linearize {kind}: an example input is needed to trace it")
        found = hf_stages(model, example_input)
        loss = hf_loss(model, example_input, labels)
        return _Split(found.stages, found.output, loss, found.inplace)
    if how == "resnet":
        return _Split(_resnet_stages(model))
    if how == "inception":
        return _Split(_inception_stages(model))
    if how == "densenet":
        return _Split(_densenet_stages(model))
    if how == "features":
        return _Split(_features_stages(model))
    if how == "sequential":
        return _Split(_sequential_stages(model))
    if example_input is None:
        raise InputError(
            f"cannot linearize {kind}: not a ResNet, DenseNet, Inception v3, VGG/MobileNetV2 "
            "(features + classifier) or nn.Sequential, and no example input to find its "
            "repeated blocks; give it a memplan_stages() method returning [(name, module), ...]"
        )
    found = find_repeated_blocks(model, example_input)
    return _Split(found.stages, found.output, inplace=found.inplace)


def split_model(
    model: nn.Module, example_input: Tensor | None = None
) -> list[tuple[str, nn.Module]]:
    """Cut a model into named stages, loss excluded (see the module docstring for the rules).

    Parameters
    ----------
    model : nn.Module
        A ResNet, DenseNet, Inception v3, VGG/MobileNetV2-like, ``nn.Sequential``, a module with
        ``memplan_stages()``, a Hugging Face model, or any model with a run of repeated blocks.
    example_input : Tensor, optional
        An input of the model: needed for the Hugging Face models and the generic repeated-block
        cut, which trace the forward once.

    Returns
    -------
    list of (str, nn.Module)
        The stages in forward order, sharing the model's parameters.

    Raises
    ------
    InputError
        When the model has none of the known structures.
    """
    stages = _split(model, example_input).stages
    if not stages:
        raise InputError(f"cannot linearize {type(model).__name__}: it has no stages")
    return stages


def linearize(
    model: nn.Module,
    example_input: Tensor,
    *,
    verify: bool = True,
    labels: Tensor | None = None,
) -> Chain:
    """Turn a model into a :class:`Chain` ending with its loss stage, and check it.

    The chain is run once in eval mode without gradients: every stage must return a single
    floating-point tensor, and (when ``verify``) the output before the loss must equal the
    model's own output on ``example_input`` (:func:`outputs_match`). The cuts found by
    tracing (Hugging Face models, repeated blocks) are always checked, while they are found.

    Parameters
    ----------
    model : nn.Module
        The model; see :func:`split_model` for the structures understood.
    example_input : Tensor
        An input of the model (images, or token ids for transformers), on the model's device.
    verify : bool
        Compare the chain's output with ``model(example_input)``.
    labels : Tensor, optional
        Targets of the loss stage, as the model's own training loss takes them (Hugging Face's
        ``labels``); see :func:`make_loss` and :mod:`memplan.torch.models.hf` for the defaults.

    Returns
    -------
    Chain
        Stages ``stage_0 .. stage_{L-1}``, the last being the loss (see :func:`make_loss`).

    Raises
    ------
    InputError
        When the model cannot be cut, a stage does not return one floating-point tensor, the
        model fails on the input, or the chain does not reproduce the model's output.
    """
    kind = type(model).__name__
    split = _split(model, example_input, labels)
    stages = split.stages
    if not stages:
        raise InputError(f"cannot linearize {kind}: it has no stages")
    if split.output is not None:
        x, inplace = split.output, split.inplace
    else:
        x, inplace = _checked_output(model, stages, example_input, verify)
    loss = split.loss if split.loss is not None else make_loss(x, example_input, labels=labels)
    return Chain(stages=[*stages, ("loss", loss)], inplace=[*inplace, False])


def _checked_output(
    model: nn.Module, stages: list[tuple[str, nn.Module]], example_input: Tensor, verify: bool
) -> tuple[Tensor, list[bool]]:
    """Run the chain in eval mode without gradients; compare with the model's output. Returns
    the output and, per stage, whether it modified its input in place.
    """
    kind = type(model).__name__
    inplace: list[bool] = []
    with eval_mode(model, *(m for _, m in stages)), torch.no_grad():
        x = run_stages(kind, stages, example_input.clone(), inplace)
        if verify:
            try:
                expected = model(example_input)
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                raise InputError(f"{kind} fails on the example input: {first_line(exc)}") from None
            mismatch = output_mismatch(kind, x, expected)
            if mismatch is not None:
                raise mismatch from None
    return x, inplace
