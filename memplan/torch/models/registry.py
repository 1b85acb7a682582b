"""A model zoo in plain PyTorch: the torchvision architectures memplan profiles, plus a GPT stack.

The CNNs reproduce torchvision's modules layer for layer (same attribute names, same parameter
counts, same initialisation scheme), so that :mod:`memplan.torch.linearize` cuts them the same way
as torchvision's own models, without needing torchvision. No pretrained weights are involved:
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
import math
import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init

from memplan.errors import InputError, did_you_mean
from memplan.torch.base.blame import BUILDING, model_errors

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "AlexNet",
    "DEFAULT_IMAGE_SHAPE",
    "GPT",
    "MODELS",
    "BasicBlock",
    "Bottleneck",
    "DenseNet",
    "GPTConfig",
    "Inception3",
    "InceptionOutputs",
    "MobileNetV2",
    "ResNet",
    "VGG",
    "build_model",
    "example_input",
    "model_names",
]

DEFAULT_BATCH_SIZE = 32
"""Batch size of image models when none is given (transformers choose their own)."""

DEFAULT_IMAGE_SHAPE = (3, 224, 224)
"""Shape of one image sample (channels, height, width) when none is given."""


def _uninitialized(cls: type[nn.Module], *args: object, **kwargs: object) -> nn.Module:
    """A layer built without its default initialisation (the caller initialises it).

    Spares the time of initialising the big layers twice; built on the default device (``meta``
    under ``with torch.device("meta")``).
    """
    return skip_init(cls, *args, device=torch.empty(0).device, **kwargs)


# --------------------------------------------------------------------------------------------
# ResNet (He et al. 2016), as torchvision.models.resnet
# --------------------------------------------------------------------------------------------


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1, 3x3 (strided), 1x1 convolutions with a residual connection (ResNet-50/101/152)."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """ResNet for 1000 classes, module for module as ``torchvision.models.ResNet``.

    Parameters
    ----------
    block : type
        :class:`BasicBlock` or :class:`Bottleneck`.
    layers : list of int
        Number of blocks in ``layer1`` .. ``layer4``.
    num_classes : int
        Outputs of the final ``fc`` layer.
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: list[int],
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        planes: int,
        blocks: int,
        stride: int = 1,
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers: list[nn.Module] = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# --------------------------------------------------------------------------------------------
# VGG (Simonyan & Zisserman 2015), as torchvision.models.vgg
# --------------------------------------------------------------------------------------------

_VGG_CONFIGS: dict[str, list[int | str]] = {
    "A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class VGG(nn.Module):
    """VGG without batch norm: ``features`` (convolutions), ``avgpool``, ``classifier``.

    Parameters
    ----------
    config : str
        ``"A"`` (VGG-11) or ``"D"`` (VGG-16).
    num_classes : int
        Outputs of the classifier.
    dropout : float
        Dropout probability of the two hidden classifier layers.
    """

    def __init__(self, config: str, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for v in _VGG_CONFIGS[config]:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(in_channels, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                in_channels = int(v)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            _uninitialized(nn.Linear, 512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            _uninitialized(nn.Linear, 4096, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            _uninitialized(nn.Linear, 4096, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


class AlexNet(nn.Module):
    """AlexNet as torchvision.models.alexnet: ``features``, ``avgpool``, ``classifier``.

    Parameters
    ----------
    num_classes : int
        Outputs of the classifier.
    dropout : float
        Dropout probability of the two hidden classifier layers.
    """

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


# --------------------------------------------------------------------------------------------
# DenseNet (Huang et al. 2017), as torchvision.models.densenet
# --------------------------------------------------------------------------------------------


class _DenseLayer(nn.Module):
    def __init__(self, num_input_features: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(num_input_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(num_input_features, bn_size * growth_rate, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, 3, padding=1, bias=False)

    def forward(self, inputs: Tensor | list[Tensor]) -> Tensor:
        prev = [inputs] if isinstance(inputs, Tensor) else inputs
        bottleneck = self.conv1(self.relu1(self.norm1(torch.cat(prev, 1))))
        return self.conv2(self.relu2(self.norm2(bottleneck)))


class _DenseBlock(nn.ModuleDict):
    def __init__(
        self, num_layers: int, num_input_features: int, bn_size: int, growth_rate: int
    ) -> None:
        super().__init__()
        for i in range(num_layers):
            layer = _DenseLayer(num_input_features + i * growth_rate, growth_rate, bn_size)
            self.add_module(f"denselayer{i + 1}", layer)

    def forward(self, init_features: Tensor) -> Tensor:
        features = [init_features]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, num_input_features: int, num_output_features: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(num_input_features)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(num_input_features, num_output_features, 1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


class DenseNet(nn.Module):
    """DenseNet-BC: ``features`` (stem, dense blocks, transitions, ``norm5``) and ``classifier``.

    Parameters
    ----------
    growth_rate : int
        Channels each dense layer adds.
    block_config : tuple of int
        Dense layers in each of the four blocks.
    num_init_features : int
        Channels of the stem convolution.
    bn_size : int
        Bottleneck width, as a multiple of ``growth_rate``.
    num_classes : int
        Outputs of the classifier.
    """

    def __init__(
        self,
        growth_rate: int = 32,
        block_config: tuple[int, int, int, int] = (6, 12, 24, 16),
        num_init_features: int = 64,
        bn_size: int = 4,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            OrderedDict(
                [
                    ("conv0", nn.Conv2d(3, num_init_features, 7, stride=2, padding=3, bias=False)),
                    ("norm0", nn.BatchNorm2d(num_init_features)),
                    ("relu0", nn.ReLU(inplace=True)),
                    ("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1)),
                ]
            )
        )
        num_features = num_init_features
        for i, num_layers in enumerate(block_config):
            block = _DenseBlock(num_layers, num_features, bn_size, growth_rate)
            self.features.add_module(f"denseblock{i + 1}", block)
            num_features += num_layers * growth_rate
            if i != len(block_config) - 1:
                trans = _Transition(num_features, num_features // 2)
                self.features.add_module(f"transition{i + 1}", trans)
                num_features //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(num_features))
        self.classifier = nn.Linear(num_features, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.constant_(m.bias, 0)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.features(x), inplace=True)
        out = torch.flatten(F.adaptive_avg_pool2d(out, (1, 1)), 1)
        return self.classifier(out)


# --------------------------------------------------------------------------------------------
# MobileNetV2 (Sandler et al. 2018), as torchvision.models.mobilenetv2
# --------------------------------------------------------------------------------------------


def _make_divisible(v: float, divisor: int, min_value: int | None = None) -> int:
    min_value = divisor if min_value is None else min_value
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class Conv2dNormActivation(nn.Sequential):
    """Convolution, batch norm, ReLU6 (torchvision.ops.Conv2dNormActivation in MobileNetV2)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        groups: int = 1,
    ) -> None:
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(
                in_channels, out_channels, kernel_size, stride, padding, groups=groups, bias=False
            ),
            nn.BatchNorm2d(out_channels),
            nn.ReLU6(inplace=True),
        )
        self.out_channels = out_channels


class InvertedResidual(nn.Module):
    """Expansion 1x1, depthwise 3x3, projection 1x1; residual when shapes allow."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        self.stride = stride
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden_dim, kernel_size=1))
        layers += [
            Conv2dNormActivation(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup
        self._is_cn = stride > 1

    def forward(self, x: Tensor) -> Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (width 1.0): ``features`` (19 modules) and ``classifier``.

    Parameters
    ----------
    num_classes : int
        Outputs of the classifier.
    dropout : float
        Dropout probability before the classifier.
    """

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        input_channel, last_channel = 32, 1280
        settings = [
            [1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
            [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1],
        ]  # fmt: skip
        features: list[nn.Module] = [Conv2dNormActivation(3, input_channel, stride=2)]
        for t, c, n, s in settings:
            output_channel = _make_divisible(c, 8)
            for i in range(n):
                features.append(
                    InvertedResidual(input_channel, output_channel, s if i == 0 else 1, t)
                )
                input_channel = output_channel
        features.append(Conv2dNormActivation(input_channel, last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(last_channel, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# --------------------------------------------------------------------------------------------
# Inception v3 (Szegedy et al. 2016), as torchvision.models.inception
# --------------------------------------------------------------------------------------------


class InceptionOutputs(NamedTuple):
    """Train-mode output of :class:`Inception3` with ``aux_logits=True``."""

    logits: Tensor
    aux_logits: Tensor | None


class BasicConv2d(nn.Module):
    """Convolution without bias, batch norm (eps 0.001), ReLU."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs: Any) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)


class InceptionA(nn.Module):
    """35x35 block: 1x1, 5x5, double 3x3 and pooling branches (``Mixed_5b`` .. ``Mixed_5d``)."""

    def __init__(self, in_channels: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(in_channels, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(in_channels, pool_features, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        branch1x1 = self.branch1x1(x)
        branch5x5 = self.branch5x5_2(self.branch5x5_1(x))
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        branch_pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([branch1x1, branch5x5, branch3x3dbl, branch_pool], 1)


class InceptionB(nn.Module):
    """Grid reduction 35x35 -> 17x17 (``Mixed_6a``)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(in_channels, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        branch3x3 = self.branch3x3(x)
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        branch_pool = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([branch3x3, branch3x3dbl, branch_pool], 1)


class InceptionC(nn.Module):
    """17x17 block with factorised 7x7 convolutions (``Mixed_6b`` .. ``Mixed_6e``)."""

    def __init__(self, in_channels: int, channels_7x7: int) -> None:
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        branch1x1 = self.branch1x1(x)
        branch7x7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        branch7x7dbl = self.branch7x7dbl_1(x)
        for conv in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4):
            branch7x7dbl = conv(branch7x7dbl)
        branch7x7dbl = self.branch7x7dbl_5(branch7x7dbl)
        branch_pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([branch1x1, branch7x7, branch7x7dbl, branch_pool], 1)


class InceptionD(nn.Module):
    """Grid reduction 17x17 -> 8x8 (``Mixed_7a``)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        branch3x3 = self.branch3x3_2(self.branch3x3_1(x))
        branch7x7x3 = self.branch7x7x3_1(x)
        for conv in (self.branch7x7x3_2, self.branch7x7x3_3, self.branch7x7x3_4):
            branch7x7x3 = conv(branch7x7x3)
        branch_pool = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([branch3x3, branch7x7x3, branch_pool], 1)


class InceptionE(nn.Module):
    """8x8 block with split 1x3 / 3x1 convolutions (``Mixed_7b``, ``Mixed_7c``)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(in_channels, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)

    def forward(self, x: Tensor) -> Tensor:
        branch1x1 = self.branch1x1(x)
        branch3x3 = self.branch3x3_1(x)
        branch3x3 = torch.cat([self.branch3x3_2a(branch3x3), self.branch3x3_2b(branch3x3)], 1)
        branch3x3dbl = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        branch3x3dbl = torch.cat(
            [self.branch3x3dbl_3a(branch3x3dbl), self.branch3x3dbl_3b(branch3x3dbl)], 1
        )
        branch_pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([branch1x1, branch3x3, branch3x3dbl, branch_pool], 1)


class InceptionAux(nn.Module):
    """Auxiliary classifier on the 17x17 features (``AuxLogits``, train mode only)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv0 = BasicConv2d(in_channels, 128, kernel_size=1)
        self.conv1 = BasicConv2d(128, 768, kernel_size=5)
        self.conv1.stddev = 0.01  # type: ignore[assignment]  # as torchvision (unused there too)
        self.fc = nn.Linear(768, num_classes)
        self.fc.stddev = 0.001  # type: ignore[assignment]

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(self.conv0(F.avg_pool2d(x, kernel_size=5, stride=3)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.fc(x)


class Inception3(nn.Module):
    """Inception v3, module for module as ``torchvision.models.Inception3``.

    Expects 299x299 images (at least 75x75). In train mode with ``aux_logits`` the output is an
    :class:`InceptionOutputs` ``(logits, aux_logits)``, as torchvision's; otherwise the logits.
    The built-in ``inception_v3`` has no auxiliary classifier, so that the model is a chain.

    Parameters
    ----------
    num_classes : int
        Outputs of the final ``fc`` layer (and of the auxiliary classifier).
    aux_logits : bool
        Build ``AuxLogits``, the auxiliary classifier on ``Mixed_6e``'s output.
    transform_input : bool
        Re-normalise the input from ImageNet statistics to [-1, 1] per channel (torchvision does
        so only for its pretrained weights).
    dropout : float
        Dropout probability before ``fc``.
    """

    memplan_image_shape = (3, 299, 299)
    """Default shape of one sample (see :func:`example_input`)."""

    def __init__(
        self,
        num_classes: int = 1000,
        aux_logits: bool = True,
        transform_input: bool = False,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        self.aux_logits = aux_logits
        self.transform_input = transform_input
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, channels_7x7=128)
        self.Mixed_6c = InceptionC(768, channels_7x7=160)
        self.Mixed_6d = InceptionC(768, channels_7x7=160)
        self.Mixed_6e = InceptionC(768, channels_7x7=192)
        self.AuxLogits: InceptionAux | None = InceptionAux(768, num_classes) if aux_logits else None
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                stddev = float(getattr(m, "stddev", 0.1))
                nn.init.trunc_normal_(m.weight, mean=0.0, std=stddev, a=-2, b=2)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _transform_input(self, x: Tensor) -> Tensor:
        if not self.transform_input:
            return x
        return inception_transform_input(x)

    def forward(self, x: Tensor) -> Tensor | InceptionOutputs:
        x = self._transform_input(x)
        x = self.maxpool1(self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x))))
        x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)))
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(self.Mixed_6a(x)))))
        aux = self.AuxLogits(x) if self.AuxLogits is not None and self.training else None
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = torch.flatten(self.dropout(self.avgpool(x)), 1)
        x = self.fc(x)
        if self.training and self.aux_logits:
            return InceptionOutputs(x, aux)
        return x


def inception_transform_input(x: Tensor) -> Tensor:
    """torchvision's ``transform_input``: ImageNet-normalised images to [-1, 1] per channel."""
    x_ch0 = x[:, 0:1] * (0.229 / 0.5) + (0.485 - 0.5) / 0.5
    x_ch1 = x[:, 1:2] * (0.224 / 0.5) + (0.456 - 0.5) / 0.5
    x_ch2 = x[:, 2:3] * (0.225 / 0.5) + (0.406 - 0.5) / 0.5
    return torch.cat((x_ch0, x_ch1, x_ch2), 1)


# --------------------------------------------------------------------------------------------
# GPT: a decoder-only transformer stack (GPT-2 layout, pre-norm, untied output head)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`GPT` model.

    Attributes
    ----------
    vocab_size : int
        Number of tokens.
    seq_len : int
        Maximum sequence length (rows of the learned position embedding); also the default one.
    n_layer, n_head, d_model : int
        Blocks, attention heads, width.
    batch_size : int
        Default batch size of :meth:`GPT.memplan_example_input`.
    """

    vocab_size: int = 50257
    seq_len: int = 1024
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    batch_size: int = 8


class GPTEmbedding(nn.Module):
    """Token embedding plus learned position embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = _uninitialized(nn.Embedding, config.vocab_size, config.d_model)
        self.wpe = _uninitialized(nn.Embedding, config.seq_len, config.d_model)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[-1], device=idx.device)
        return self.wte(idx) + self.wpe(positions)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (``F.scaled_dot_product_attention``)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.d_model % config.n_head:
            raise InputError(
                f"gpt: d_model {config.d_model} is not a multiple of n_head {config.n_head}"
            )
        self.n_head = config.n_head
        self.qkv = _uninitialized(nn.Linear, config.d_model, 3 * config.d_model)
        self.proj = _uninitialized(nn.Linear, config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    """Feed-forward layer: d -> 4d, GELU, 4d -> d."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = _uninitialized(nn.Linear, config.d_model, 4 * config.d_model)
        self.act = nn.GELU()
        self.proj = _uninitialized(nn.Linear, 4 * config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-2-like language model: embedding, ``n_layer`` blocks, final LayerNorm, linear head.

    The input is a ``(batch, seq)`` tensor of token ids; the output the ``(batch, seq, vocab)``
    logits. The output head is not tied to the token embedding, so that each stage of the chain
    owns its weights.

    Parameters
    ----------
    config : GPTConfig
        Sizes of the model.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = GPTEmbedding(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = _uninitialized(nn.Linear, config.d_model, config.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for block in self.blocks:  # GPT-2's scaled init of the residual projections
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def memplan_stages(self) -> list[tuple[str, nn.Module]]:
        """The chain memplan profiles: embedding, one stage per block, final norm + head."""
        stages: list[tuple[str, nn.Module]] = [("embedding", self.embed)]
        stages += [(f"block{i}", block) for i, block in enumerate(self.blocks)]
        stages.append(("head", nn.Sequential(self.ln_f, self.lm_head)))
        return stages

    def memplan_example_input(
        self, batch_size: int | None = None, input_shape: tuple[int, ...] | None = None
    ) -> Tensor:
        """Random token ids of shape ``(batch, seq)``; ``input_shape`` is ``(seq,)``."""
        batch = self.config.batch_size if batch_size is None else batch_size
        if input_shape is None:
            seq = self.config.seq_len
        elif len(input_shape) == 1:
            seq = input_shape[0]
        else:
            raise InputError(
                f"input shape {','.join(map(str, input_shape))}: a transformer takes (seq,), "
                f"e.g. {self.config.seq_len}"
            )
        if not 1 <= seq <= self.config.seq_len:
            raise InputError(
                f"input shape {seq}: sequence length must be 1..{self.config.seq_len} "
                "(the size of the position embedding)"
            )
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, self.config.vocab_size, (batch, seq), generator=generator)


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
"""Name -> factory (no arguments) of every built-in model."""


def model_names() -> list[str]:
    """The names :func:`build_model` accepts without a ``module:factory`` spec."""
    return list(MODELS)


def _torchvision_factory(name: str) -> Callable[[], nn.Module] | None:
    """A torchvision model of that name, when torchvision is installed and loads."""
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
    return partial(tv_models.get_model, name, weights=None)


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
    importing it may raise: :func:`build_model` and :func:`memplan.torch.profiler.join.resolve_join` import
    it inside :func:`~memplan.torch.base.blame.model_errors`)."""
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
    from memplan.torch.models.hf import hf_example_input, is_hf_model

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
        from memplan.torch.models.hf import build_hf_model

        return build_hf_model(
            spec, config, batch_size=batch_size, input_shape=input_shape, seed=seed
        )
    if config:
        raise InputError(f"--config: only hf: models take config values (not {spec!r})")
    given: Tensor | None = None
    if spec in MODELS:
        factory: Callable[[], object] = MODELS[spec]
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
