"""The math libraries' workspace of a GPU profile (``workspace_size``) is static memory."""

from __future__ import annotations

import pytest

import memplan
from memplan.algorithms.timeline import static_memory
from memplan.loop import Optimizer, TrainingLoop

WORKSPACE = 68_157_440  # 65 MiB: what cuBLAS kept on an H100 (forward's and backward's threads)


def _with_workspace(name: str, workspace: int | None) -> memplan.Profile:
    data = memplan.load_profile(name).model_dump(exclude_none=True)
    if workspace is not None:
        data["workspace_size"] = workspace
    return memplan.load_profile(data)


@pytest.mark.parametrize("algo", ["store-all", "rotor", "periodic"])
@pytest.mark.parametrize("gradients", ["at-backward", "kept"])
def test_the_workspace_is_in_every_figure(algo, gradients):
    plain = _with_workspace("resnet18", None)
    with_ws = _with_workspace("resnet18", WORKSPACE)
    loop = TrainingLoop(Optimizer("sgd"), gradients)
    assert static_memory(with_ws, loop) == static_memory(plain, loop) + WORKSPACE
    budget = memplan.solve(plain, "store-all", 2**50, gradients=gradients).peak_memory
    a = memplan.solve(plain, algo, budget, gradients=gradients)
    b = memplan.solve(with_ws, algo, budget + WORKSPACE, gradients=gradients)
    assert a.feasible and b.feasible
    assert b.static_memory == a.static_memory + WORKSPACE
    assert b.peak_memory == a.peak_memory + WORKSPACE
    assert b.makespan == a.makespan  # the same plan: the workspace only moves every figure
    check = memplan.simulate(with_ws, b)
    assert check.valid and check.peak_memory == b.peak_memory
    # at the budget without the workspace, a profile with one needs more recomputation or fails
    tight = memplan.solve(with_ws, algo, budget, gradients=gradients)
    assert not tight.feasible or tight.makespan >= b.makespan


def test_no_workspace_for_an_activation_budget():
    with_ws = _with_workspace("resnet18", WORKSPACE)
    assert static_memory(with_ws, TrainingLoop(Optimizer("none"))) == 0


def test_the_field_round_trips_and_is_checked():
    prof = _with_workspace("resnet18", WORKSPACE)
    again = memplan.load_profile(memplan.save_profile(prof))
    assert again.workspace_size == WORKSPACE
    data = prof.model_dump(exclude_none=True)
    data["workspace_size"] = -1
    with pytest.raises(memplan.InputError, match="workspace_size"):
        memplan.load_profile(data)


@pytest.mark.torch
def test_measured_on_a_gpu_only():
    torch = pytest.importorskip("torch")
    from memplan.torch.profiler.model import library_workspace

    assert library_workspace(torch.device("cpu"), torch.float32) == 0
    if torch.cuda.is_available():  # make gpu-check's machine: what cuBLAS keeps, a few MiB or more
        assert library_workspace(torch.device("cuda"), torch.float32) > 0
