"""memplan.torch.measure.conditions: what a profile's sizes depend on, recorded and checked."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

from memplan.profile import load_profile  # noqa: E402
from memplan.profile.model import Conditions  # noqa: E402
from memplan.torch.measure.conditions import (  # noqa: E402
    KERNEL_VARIABLES,
    ConditionsWarning,
    check_conditions,
    current_conditions,
    differences,
    intra_op_threads,
    recorded_conditions,
    training_as_profiled,
)

pytestmark = pytest.mark.torch

CPU = torch.device("cpu")


def _profile(conditions: dict | None, *, kind: str = "cpu", extra: dict | None = None):
    measured = {"torch": "2.0.0"}
    if conditions is not None:
        measured["conditions"] = conditions
    if extra is not None:
        measured["extra"] = extra
    return load_profile(
        {
            "format": "memplan-profile/1",
            "model": "net",
            "dtype": "float32",
            "device": {"kind": kind, "name": "Some CPU"},
            "measured": measured,
            "input_size": 4,
            "stages": [
                {
                    "name": "loss",
                    "forward_time": 1.0,
                    "backward_time": 1.0,
                    "output_size": 4,
                    "saved_size": 4,
                },
            ],
        }
    )


def _here(**changes) -> dict:
    now = current_conditions(CPU, "float32").model_dump(exclude_none=True)
    now.update(changes)
    return now


def test_current_conditions():
    now = current_conditions(CPU, "float32")
    assert now.threads == torch.get_num_threads()
    assert now.torch == torch.__version__ and now.dtype == "float32" and now.device == "cpu"
    assert now.cpu and now.cpu_capability


def test_the_same_conditions_differ_nowhere():
    assert differences(_profile(_here()), current_conditions(CPU, "float32")) == {}


def test_each_condition_that_differs_is_found():
    prof = _profile(_here(threads=64, torch="1.0.0", cpu="Another CPU", dtype="bfloat16"))
    found = differences(prof, current_conditions(CPU, "float32"))
    assert found["threads"] == (64, torch.get_num_threads())
    assert found["torch"] == ("1.0.0", torch.__version__)
    assert set(found) == {"threads", "torch", "cpu", "dtype"}


def test_a_kernel_variable_set_on_one_side_only_differs(monkeypatch):
    for name in KERNEL_VARIABLES:  # make test-kernels sets some: none here
        monkeypatch.delenv(name, raising=False)
    prof = _profile(_here(kernels={"DNNL_MAX_CPU_ISA": "AVX2"}))
    assert "kernels" in differences(prof, current_conditions(CPU, "float32"))
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    assert differences(prof, current_conditions(CPU, "float32")) == {}


def test_old_profiles_say_what_they_can():
    old = _profile(None, extra={"threads": 3})
    was = recorded_conditions(old)
    assert was == Conditions(
        threads=3, cpu="Some CPU", torch="2.0.0", dtype="float32", device="cpu"
    )
    assert differences(old, Conditions(threads=3, torch="2.0.0")) == {}
    assert "threads" in differences(old, Conditions(threads=1))
    assert recorded_conditions(_profile(None, kind="synthetic")) is None


def test_estimated_profiles_compare_torch_and_dtype_only():
    prof = _profile(_here(threads=64, cpu="Another CPU"), kind="estimated")
    assert differences(prof, current_conditions(CPU, "float32")) == {}
    prof = _profile(_here(torch="1.0.0"), kind="estimated")
    assert set(differences(prof, current_conditions(CPU, "float32"))) == {"torch"}


def test_training_as_profiled_sets_the_threads_and_restores_them():
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    said: list[str] = []
    prof = _profile(_here(threads=other, torch="1.0.0"))
    with training_as_profiled(prof, CPU, said.append) as found:
        assert torch.get_num_threads() == other
        assert set(found) == {"threads", "torch"}
    assert torch.get_num_threads() == before
    assert any("training on" in line for line in said)
    assert any("warning" in line and "torch 1.0.0" in line for line in said)


def test_check_conditions_warns():
    other = 2 if torch.get_num_threads() == 1 else 1
    with pytest.warns(ConditionsWarning, match=rf"torch.set_num_threads\({other}\)"):
        check_conditions(_profile(_here(threads=other)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_conditions(_profile(_here())) == {}


def test_intra_op_threads():
    before = torch.get_num_threads()
    with intra_op_threads(None) as n:
        assert n == before
    with intra_op_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before


def test_profile_copy_is_not_shared():
    # differences never changes the profile it reads
    prof = _profile(_here(threads=64))
    dump = copy.deepcopy(prof.model_dump())
    differences(prof, current_conditions(CPU, "float32"))
    assert prof.model_dump() == dump
