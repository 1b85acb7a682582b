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

from memplan.torch.measure.stage import measure_stage
from memplan.torch.measure.step import (
    StepMeasurement,
    make_optimizer,
    measure_step,
    train_under_plan,
)
from memplan.torch.models.registry import MODELS, build_model, example_input, model_names
from memplan.torch.planner import enable, fit
from memplan.torch.profiler.chain import profile_chain
from memplan.torch.profiler.model import profile_model
from memplan.torch.runtime.checkpointed import CheckpointedChain, checkpointed
from memplan.torch.runtime.plan import RuntimeCounters
from memplan.torch.runtime.planned import apply_plan, disable, planned
from memplan.torch.runtime.planned_model import PlannedModel
from memplan.torch.split.linearize import Chain, linearize, split_model

__all__ = [
    "MODELS",
    "Chain",
    "CheckpointedChain",
    "PlannedModel",
    "RuntimeCounters",
    "StepMeasurement",
    "apply_plan",
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
