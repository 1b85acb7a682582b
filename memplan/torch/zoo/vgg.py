"""VGG (Simonyan & Zisserman 2015) and AlexNet (Krizhevsky et al. 2012), as torchvision.models.vgg and alexnet.

Adapted from torchvision (BSD-3-Clause, Copyright (c) Soumith Chintala 2016; the notice is in
:mod:`memplan.torch.zoo`). Used only when torchvision itself cannot be imported.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from memplan.torch.zoo.layers import uninitialized

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
            uninitialized(nn.Linear, 512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            uninitialized(nn.Linear, 4096, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            uninitialized(nn.Linear, 4096, num_classes),
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
