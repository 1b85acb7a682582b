"""The Python API of the SPEC: what a notebook or a test harness calls."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import memplan
from memplan.profile.synthetic import random_chain


def test_spec_example_round_trip():
    prof = memplan.load_profile(random_chain(8, seed=5).to_dict())
    sched = memplan.solve(prof, algo="rotor", memory=400, slots=500, optimizer="none")
    assert sched.feasible and sched.peak_memory <= 400
    assert json.loads(sched.to_json())["makespan"] == sched.makespan
    check = memplan.simulate(prof, sched)
    assert check.valid and check.makespan == pytest.approx(sched.makespan)
    assert check.peak_memory == sched.peak_memory and check.violation is None


def test_algorithms_stays_a_function_after_solving():
    memplan.solve(random_chain(3, seed=1), "rotor", "1GB")
    names = [a["name"] for a in memplan.algorithms()]
    assert names[:4] == ["store-all", "periodic", "revolve", "rotor"]


def test_the_algorithms_subpackage_imports_beside_the_function():
    code = (
        "import memplan.algorithms.chain.rotor as rotor, memplan, sys\n"
        "assert rotor is sys.modules['memplan.algorithms.chain.rotor']\n"
        "assert memplan.algorithms.chain is sys.modules['memplan.algorithms.chain']\n"
        "assert memplan.algorithms()[3]['name'] == 'rotor'\n"
        "from memplan.algorithms.chain import rotor as again\n"
        "assert again is rotor and memplan.algorithms.__name__ == 'algorithms'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_submodule_is_an_attribute_in_a_fresh_interpreter():
    """``memplan.api.describe`` after a bare ``import memplan``: no earlier import needed."""
    code = (
        "import memplan, sys\n"
        "assert 'memplan.api' not in sys.modules\n"
        "assert memplan.api is sys.modules['memplan.api'] and callable(memplan.api.describe)\n"
        "assert memplan.profile.load_profile is memplan.load_profile\n"
        "assert not hasattr(memplan, 'no_such_module') and not hasattr(memplan, '__wrapped__')\n"
        "assert memplan.algorithms()[3]['name'] == 'rotor'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_infeasible_is_a_status_not_an_exception():
    prof = random_chain(5, seed=2)
    sched = memplan.solve(prof, "rotor", 1, optimizer="none")
    assert not sched.feasible and sched.solver.status == "infeasible"
    assert sched.min_memory > 1 and sched.ops == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algo": "nope"}, "unknown algorithm 'nope'; choose one of: store-all"),
        ({"memory": "8G"}, "ambiguous"),
        ({"memory": None}, "memory budget is required"),
        ({"slots": 1}, "--slots 1: expected an integer from 2 to"),
        ({"optimizer": "lion"}, "--optimizer 'lion'"),
    ],
)
def test_bad_arguments_raise_input_error(kwargs, message):
    args = {"algo": "rotor", "memory": "1GB"} | kwargs
    with pytest.raises(memplan.InputError, match=message):
        memplan.solve(random_chain(3), **args)


def test_import_is_light():
    """``import memplan`` must not import torch, matplotlib or ortools (fast CLI start-up)."""
    code = (
        "import sys, memplan; "
        "print([m for m in ('torch', 'matplotlib', 'ortools') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_written_files_have_normal_permissions(tmp_path):
    path = tmp_path / "p.yaml"
    memplan.save_profile(random_chain(2), path)
    assert path.stat().st_mode & 0o044  # readable by group/others under the usual umask


def test_describe_reports_memory_per_family():
    prof = random_chain(6, seed=3)
    info = memplan.api.describe(prof, optimizer="none")
    assert info["min_memory"]["chain"] <= info["store_all_memory"]
    assert not memplan.solve(
        prof, "rotor", info["min_memory"]["chain"] - 1, optimizer="none"
    ).feasible
    assert memplan.solve(prof, "rotor", info["min_memory"]["chain"], optimizer="none").feasible
    assert memplan.solve(prof, "store-all", info["store_all_memory"], optimizer="none").feasible


def test_compare_across_families_uses_one_lower_bound():
    """Mixing families, every ratio is over the compute lower bound, so the columns compare."""
    prof = memplan.load_profile(random_chain(6, seed=8).to_dict() | {"bandwidth": 1e6})
    budgets = [memplan.api.describe(prof, "none")["store_all_memory"] - 5]
    mixed = memplan.compare(prof, ["rotor", "dynprog"], budgets, optimizer="none")
    alone = memplan.compare(prof, ["dynprog"], budgets, optimizer="none")
    for row in mixed:
        if row.feasible:
            assert row.ratio == pytest.approx(row.makespan / prof.lower_bound)
    if alone[0].feasible:
        sched = memplan.solve(prof, "dynprog", budgets[0], optimizer="none")
        assert alone[0].ratio == pytest.approx(sched.makespan / sched.lower_bound)
