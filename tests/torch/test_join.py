"""Join profiles: the bundled Siamese and cross-modal ones, and profiling a join model (tiny)."""

from __future__ import annotations

import pytest

import memplan
from memplan.api import describe

BUNDLED = {"siamese-resnet18": 3, "cross-modal-resnet18": 2}


@pytest.mark.parametrize(("name", "branches"), BUNDLED.items())
def test_bundled_join_profiles(name: str, branches: int) -> None:
    prof = memplan.load_profile(name)
    assert prof.kind == "join" and prof.families == ("join",)
    assert len(prof.branches) == branches
    assert prof.device.kind == "cpu" and prof.batch_size == 8
    info = describe(prof, optimizer="none")
    low, high = info["min_memory"]["join"], info["store_all_memory"]
    assert info["join_model"] == "chain" and low < high
    sched = memplan.solve(prof, "join", (low + high) // 2, optimizer="none", slots=40)
    assert sched.feasible and sched.peak_memory <= (low + high) // 2
    assert prof.lower_bound <= sched.makespan
    assert memplan.solve(prof, "join", high, optimizer="none").makespan == pytest.approx(
        prof.lower_bound
    )
    assert not memplan.solve(prof, "join", low - 1, optimizer="none").feasible


def test_siamese_branches_share_their_weights() -> None:
    prof = memplan.load_profile("siamese-resnet18")
    first, *others = prof.branches
    assert sum(st.weight_size for st in first.stages) > 10_000_000  # ResNet-18: 11.2M params
    assert all(st.weight_size == 0 for b in others for st in b.stages)


def test_profile_a_join_model_from_a_factory(tmp_path) -> None:
    pytest.importorskip("torch")
    from memplan.torch.profiler.model import profile_model

    prof = profile_model("memplan.torch.models.join:tiny_join", batch_size=2, repeats=1)
    assert prof.kind == "join" and [b.name for b in prof.branches] == ["left", "right"]
    assert [len(b.stages) for b in prof.branches] == [3, 4]
    assert prof.branches[0].input_size == 2 * 16 * 4  # float32 inputs (2, 16)
    assert prof.branches[0].stages[0].output_size == 2 * 32 * 4
    assert prof.turn.output_size == 4  # the scalar loss
    info = describe(prof, optimizer="none")
    assert memplan.solve(prof, "join", info["store_all_memory"], optimizer="none").feasible


def test_profile_rejects_options_a_join_cannot_take() -> None:
    pytest.importorskip("torch")
    from memplan.torch.profiler.model import profile_model

    with pytest.raises(memplan.InputError, match="join network"):
        profile_model("tiny-join", input_shape=(3, 8, 8))
