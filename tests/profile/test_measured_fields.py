"""The profile fields of the measurement: conditions, noise, weight_grad_size (docs/formats.md)."""

from __future__ import annotations

import copy

import pytest

from memplan.errors import InputError
from memplan.profile import load_profile, save_profile

BASE = {
    "format": "memplan-profile/1",
    "model": "net",
    "input_size": 40,
    "stages": [
        {
            "name": "a",
            "forward_time": 1.0,
            "backward_time": 2.0,
            "output_size": 8,
            "saved_size": 16,
            "weight_size": 100,
            "weight_grad_size": 96,
            "backward_overhead_fresh": 4,
            "forward_overhead": 6,
            "forward_overhead_all": 2,
            "input_saved": True,
            "output_saved": False,
        },
        {
            "name": "loss",
            "forward_time": 1.0,
            "backward_time": 1.0,
            "output_size": 4,
            "saved_size": 4,
            "weight_size": 8,
            "weight_grad_size": 0,
        },
    ],
    "measured": {
        "torch": "2.13.0+cpu",
        "conditions": {
            "threads": 1,
            "cpu": "AMD EPYC",
            "cpu_capability": "AVX512",
            "kernels": {"DNNL_MAX_CPU_ISA": "AVX2"},
            "mkldnn": True,
            "torch": "2.13.0+cpu",
            "dtype": "float32",
            "device": "cpu",
        },
        "noise": {"spread": 0.031, "outliers": 2, "flagged": ["a"]},
    },
}


def _with(path: str, value) -> dict:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return data


def test_the_new_fields_round_trip():
    prof = load_profile(BASE)
    assert prof.measured.conditions.threads == 1
    assert prof.measured.conditions.kernels == {"DNNL_MAX_CPU_ISA": "AVX2"}
    assert prof.measured.noise.flagged == ["a"]
    assert [s.weight_grad_size for s in prof.stages] == [96, 0]
    assert prof.stages[0].backward_overhead_fresh == 4
    assert prof.stages[0].forward_overhead_all == 2 and prof.stages[0].input_saved is True
    assert load_profile(save_profile(prof)) == prof


def test_profiles_without_them_still_load():
    data = copy.deepcopy(BASE)
    del data["measured"]["conditions"], data["measured"]["noise"]
    for stage in data["stages"]:
        stage.pop("weight_grad_size")
        for key in ("backward_overhead_fresh", "forward_overhead_all", "input_saved"):
            stage.pop(key, None)
        stage.pop("output_saved", None)
    prof = load_profile(data)
    assert prof.measured.conditions is None and prof.stages[0].weight_grad_size is None
    assert load_profile("resnet50").measured.conditions is None  # a bundled profile


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("stages.0.weight_grad_size", -1, "stages[0].weight_grad_size"),
        ("stages.0.backward_overhead_fresh", "4", "stages[0].backward_overhead_fresh"),
        ("measured.conditions.threads", 0, "measured.conditions.threads"),
        ("measured.conditions.cores", 2, "measured.conditions.cores"),
        ("measured.noise.spread", -0.5, "measured.noise.spread"),
        ("measured.noise.outliers", 1.5, "measured.noise.outliers"),
        ("stages.0.input_saved", "yes", "stages[0].input_saved"),
        ("stages.0.forward_overhead_all", -7, "stages[0].forward_overhead_all"),
    ],
)
def test_bad_values_name_their_field(path, value, field):
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_profile(_with(path, value))


def test_fields_are_checked_one_by_one():
    """No check across fields: tools that edit a measured profile (zero its overheads or its
    weights, as memplan's own activation replay does) keep working on it."""
    data = _with("stages.0.weight_grad_size", 200)  # more than the weights: still a profile
    data["stages"][0]["forward_overhead"] = 0  # below forward_overhead_all
    assert load_profile(data).stages[0].weight_grad_size == 200
