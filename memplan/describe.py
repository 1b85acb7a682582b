"""What ``memplan info`` shows about a profile: :func:`describe` (re-exported by :mod:`memplan.api`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memplan.algorithms import FAMILIES
from memplan.algorithms.timeline import static_memory
from memplan.loop import Optimizer, parse_optimizer
from memplan.profile.io import load_profile
from memplan.profile.memory import loop_on
from memplan.profile.model import Profile


def describe(
    profile: Profile | Mapping[str, Any] | str,
    optimizer: str | Optimizer = "sgd",
    gradients: str = "auto",
) -> dict[str, Any]:
    """What ``memplan info`` shows: the profile's metadata, totals and the memory each family needs.

    ``store_all_memory`` is the budget store-all needs (no recomputation); ``min_memory`` the least
    budget with which any plan of a family exists: ``chain``, everything recomputed from the
    input; ``offload``, every activation offloaded (*Optimal GPU-CPU Offloading Strategies*, Euro-Par 2020). ``offload_peak`` is M_peak, the
    budget above which nothing needs offloading (the store-all need). All include the static
    memory of ``optimizer`` (and its step after the backward) and every figure is in the
    accounting of the training loop ``gradients`` (docs/model.md; ``gradients`` says which, None
    for a graph), the one every chain-model and join family plans in: ``static_memory`` is that
    loop's. Each family that fits the profile adds its own figures (``Family.describe``).
    """
    prof = load_profile(profile)
    chosen = parse_optimizer(optimizer)
    shown = loop_on(prof, chosen, gradients, terms=prof.kind != "graph")
    static = static_memory(prof, shown)
    device = prof.device.model_dump(exclude_none=True) if prof.device else None
    common = {
        "model": prof.model,
        "kind": prof.kind,
        "families": list(prof.families),
        "stages": prof.length,
        "batch_size": prof.batch_size,
        "input_shape": prof.input_shape,
        "dtype": prof.dtype,
        "device": device,
        "bandwidth": prof.bandwidth,
        "measured": prof.measured.model_dump(exclude_none=True) if prof.measured else None,
        "weight_size": prof.weight_size,
        "optimizer": chosen.text,
        "gradients": shown.gradients,
        "static_memory": static,
        "lower_bound": prof.lower_bound,
        "sha256": prof.sha256(),
    }
    found: dict[str, Any] = {}
    for name in prof.families:
        family = FAMILIES[name]
        if family.describe is not None:
            loop = loop_on(prof, chosen, gradients, terms=family.loop_terms)
            own = static_memory(prof, loop)
            found = _merge(found, family.describe(prof, own, loop))
    return {**common, **found}


def _merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``into`` with a family's figures: ``min_memory`` entries merged, the stage table last."""
    table = {k: v for k, v in into.items() if k == "stage_table"}
    merged = {k: v for k, v in into.items() if k != "stage_table"}
    for key, value in more.items():
        if key == "min_memory":
            merged[key] = {**merged.get(key, {}), **value}
        else:
            merged[key] = value
    return {**merged, **table} if "stage_table" not in more else merged
