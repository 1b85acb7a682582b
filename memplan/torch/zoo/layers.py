"""Layer helpers shared by the zoo's architectures (memplan's own code)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import skip_init


def uninitialized(cls: type[nn.Module], *args: object, **kwargs: object) -> nn.Module:
    """A layer built without its default initialisation (the caller initialises it).

    Spares the time of initialising the big layers twice; built on the default device (``meta``
    under ``with torch.device("meta")``).
    """
    return skip_init(cls, *args, device=torch.empty(0).device, **kwargs)


__all__ = ["uninitialized"]
