"""The bundled profiles: measured ones say CPU, estimated ones say which GPU; all of them solve."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import memplan
from memplan.api import describe
from memplan.cli.app import app
from memplan.gpu import load_gpu
from memplan.profile import bundled_profiles

CHAIN_ALGORITHMS = ["store-all", "periodic", "revolve", "rotor"]
JOIN_PROFILES = ("siamese-resnet18", "cross-modal-resnet18")
"""Join networks (branches + turn): tests/torch/test_join.py checks them."""
NAMES = sorted(
    name for name in bundled_profiles() if name not in JOIN_PROFILES and "-graph-" not in name
)
"""The chain profiles (the graph profiles, ``MODEL-graph-bB``, have tests/algorithms/graph/test_bundled.py)."""


TRANSFORMERS = ("gpt2", "llama-1b", "bert-base", "vit-b-16")
"""The Hugging Face models bundled (issue 15): measured on CPU at small sizes, estimated in
bfloat16 for the A100 and the H100 at training sizes."""


def test_the_issue_list_is_bundled():
    measured = {
        "resnet18",
        "resnet50",
        "resnet101",
        "resnet152",
        "vgg16",
        "densenet121",
        "gpt-small",
        *TRANSFORMERS,
    }
    estimated = {
        f"{m}@a100"
        for m in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "densenet121")
    } | {"vgg16@a100", "inception_v3@a100", "gpt-small@a100"}
    estimated |= {f"{m}@{g}" for m in ("resnet50", "gpt-small") for g in ("v100", "h100")}
    estimated |= {f"{m}@{g}" for m in TRANSFORMERS for g in ("a100", "h100")}
    assert measured | estimated <= set(NAMES)


@pytest.mark.parametrize(
    "name", sorted(f"{m}{g}" for m in TRANSFORMERS for g in ("", "@a100", "@h100"))
)
def test_transformer_profiles_work_with_info_and_compare(name):
    prof = memplan.load_profile(name)
    assert prof.model.startswith("hf:")
    assert prof.dtype == ("bfloat16" if "@" in name else "float32")
    assert [s.name for s in prof.stages][-2:] == ["head", "loss"]
    runner = CliRunner()
    result = runner.invoke(app, ["info", name])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["compare", name, "--algos", "store-all,periodic,rotor", "--mem", "auto:3"]
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", NAMES)
def test_bundled_profile_metadata_and_solves(name):
    prof = memplan.load_profile(name)
    if "@" in name:
        gpu = name.split("@", 1)[1]
        assert prof.device.kind == "estimated"
        assert prof.measured.estimate["catalog"] == gpu
        assert prof.bandwidth == load_gpu(gpu).host_bandwidth
        assert all(s.extra["estimate"]["bound"] in ("compute", "memory") for s in prof.stages)
    else:
        assert prof.device.kind == "cpu"
        # profiles made since issue 14 carry the CPU copy rate the runtime offloads at
        if prof.bandwidth is not None:
            assert prof.bandwidth > 0 and "bandwidth" in (prof.measured.extra or {})
    info = describe(prof, optimizer="none")
    low, high = info["min_memory"]["chain"], info["store_all_memory"]
    middle = (low + high) // 2
    for algo in CHAIN_ALGORITHMS:
        budget = high if algo == "store-all" else middle
        sched = memplan.solve(prof, algo, budget, optimizer="none")
        assert sched.feasible, (name, algo)
        assert sched.peak_memory <= budget
    assert not memplan.solve(prof, "rotor", low - 1, optimizer="none").feasible
