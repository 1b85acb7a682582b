"""Profiling PyTorch models for memplan (needs the ``torch`` extra).

``import memplan`` never imports torch; ``import memplan.torch`` does.

>>> import memplan.torch                                                    # doctest: +SKIP
>>> model = memplan.torch.enable(model, memory="8GB", example_input=batch)  # doctest: +SKIP
>>> from memplan.torch import profile_model                                 # doctest: +SKIP
>>> prof = profile_model("resnet18", batch_size=8, input_shape=(3, 224, 224))  # doctest: +SKIP
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("memplan.torch needs PyTorch: pip install 'memplan[torch]'") from exc

from memplan.torch.runtime.planned import PlannedModel, disable, enable, planned
from memplan.torch.split.linearize import Chain, linearize, split_model
from memplan.torch.measure.step import (
    StepMeasurement,
    make_optimizer,
    measure_step,
    train_under_plan,
)
from memplan.torch.models.registry import MODELS, build_model, example_input, model_names
from memplan.torch.profiler.model import measure_stage, profile_chain, profile_model
from memplan.torch.runtime.iteration import CheckpointedChain, RuntimeCounters, checkpointed, fit

__all__ = [
    "MODELS",
    "Chain",
    "CheckpointedChain",
    "PlannedModel",
    "RuntimeCounters",
    "StepMeasurement",
    "build_model",
    "checkpointed",
    "disable",
    "enable",
    "example_input",
    "fit",
    "linearize",
    "make_optimizer",
    "measure_stage",
    "measure_step",
    "model_names",
    "planned",
    "profile_chain",
    "profile_model",
    "split_model",
    "train_under_plan",
]
