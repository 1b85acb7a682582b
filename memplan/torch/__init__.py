"""Profiling PyTorch models and training them under memplan's plans (needs the ``torch`` extra).

``import memplan`` never imports torch; ``import memplan.torch`` does.

>>> import memplan.torch                                                    # doctest: +SKIP
>>> model = memplan.torch.enable(model, memory="8GB", example_input=batch)  # doctest: +SKIP
>>> from memplan.torch import profile_model                                 # doctest: +SKIP
>>> prof = profile_model("resnet18", batch_size=8, input_shape=(3, 224, 224))  # doctest: +SKIP

The layer's floors, lowest first; a module imports from its own floor or the floors below, never
above (``tests/test_import_graph.py`` checks it, with no import circle and no private name
imported across modules):

1. :mod:`~memplan.torch.base`: whose error it is (``blame``), the device, a tensor's storage.
2. :mod:`~memplan.torch.zoo` (the architectures memplan builds itself: torchvision's, copied
   under its BSD-3 licence and used only when torchvision does not import, and a GPT) and
   :mod:`~memplan.torch.estimate` (GPU times from operator counts, a roofline).
3. :mod:`~memplan.torch.models`: which model a name means (the registry, example inputs,
   Hugging Face building, join networks).
4. :mod:`~memplan.torch.split`: cutting a model into a chain (``linearize``, repeated blocks,
   Hugging Face cutting and loss, a language model's head and loss in chunks of tokens).
5. :mod:`~memplan.torch.runtime`: training a chain under a schedule (the plan, the planned
   iteration, transfers, recomputation, selective policies, :func:`checkpointed`, a plan
   installed on a model).
6. :mod:`~memplan.torch.measure`: what a plan needs measured (memory probes, one stage, one
   training step, allocator peaks, timing, bandwidth, conditions, fake-tensor runs).
7. :mod:`~memplan.torch.profiler`: orchestration into a profile (a chain, a join network, a
   whole model, an operator graph).
8. :mod:`~memplan.torch.planner` (:func:`enable`, :func:`fit`: profile, solve, apply) and
   :mod:`~memplan.torch.compare` (memplan's plans against other ways of training).
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
