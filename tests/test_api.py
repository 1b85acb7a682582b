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


def test_list_algorithms():
    names = [a["name"] for a in memplan.list_algorithms()]
    assert names[:4] == ["store-all", "periodic", "revolve", "rotor"]
    assert {a["family"] for a in memplan.list_algorithms()} == {
        "chain",
        "offload",
        "combined",
        "join",
        "graph",
        "pipeline",
    }


def test_memplan_algorithms_is_the_plain_subpackage():
    """``memplan.algorithms`` is a module, before and after a solve; the list is a function of
    its own name (the contract's ``memplan.list_algorithms()``)."""
    code = (
        "import types, sys, memplan\n"
        "assert memplan.list_algorithms()[3]['name'] == 'rotor'\n"
        "import memplan.algorithms.chain.rotor as rotor\n"
        "assert rotor is sys.modules['memplan.algorithms.chain.rotor']\n"
        "memplan.solve('resnet18', 'rotor', '1GB')\n"
        "assert isinstance(memplan.algorithms, types.ModuleType)\n"
        "assert memplan.algorithms is sys.modules['memplan.algorithms']\n"
        "assert memplan.algorithms.chain is sys.modules['memplan.algorithms.chain']\n"
        "assert type(sys.modules['memplan']) is types.ModuleType\n"
        "assert not callable(memplan.algorithms)\n"
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
        "assert memplan.list_algorithms()[3]['name'] == 'rotor'\n"
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
        ({"slots": 1}, "slots=1: expected an integer from 2 to"),
        ({"optimizer": "lion"}, "optimizer='lion'"),
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


# ---- one door: validation once, the replay returned, the family named once ---------------------


def test_the_arguments_are_checked_before_the_profile_is_read(tmp_path):
    """A bad budget or option is named even when the profile could not be read at all (a piped
    profile may take minutes to arrive)."""
    missing = tmp_path / "not-there.yaml"
    with pytest.raises(memplan.InputError, match=r"^memory: size '8G'"):
        memplan.solve(str(missing), "rotor", "8G")
    with pytest.raises(memplan.InputError, match=r"^slots=1: expected an integer"):
        memplan.solve(str(missing), "rotor", "8GB", slots=1)
    with pytest.raises(memplan.InputError, match=r"not-there\.yaml"):
        memplan.solve(str(missing), "rotor", "8GB")


def test_the_api_is_five_functions():
    """Issue 39: one door. The variants of solve are gone; the rest of the module serves the
    command line and says so."""
    assert sorted(memplan.api.__all__) == [
        "compare", "list_algorithms", "load_profile", "simulate", "solve",
    ]  # fmt: skip
    for gone in ("solve_and_replay", "solve_checked", "check_arguments", "check_budget"):
        assert not hasattr(memplan.api, gone), gone


def test_typed_arguments_pass_through_the_door():
    """A budget and an optimizer checked once (MemoryBudget, Optimizer) are taken as they are;
    a library error names the Python parameter."""
    from memplan.budget import check_memory
    from memplan.loop import parse_optimizer

    prof = random_chain(6, seed=4)
    budget, optimizer = check_memory("1MB"), parse_optimizer("adam:fused")
    typed = memplan.solve(prof, "rotor", budget, optimizer=optimizer)
    plain = memplan.solve(prof, "rotor", "1MB", optimizer="adam:fused")
    assert typed.to_dict() | {"solver": None} == plain.to_dict() | {"solver": None}
    assert typed.budget.optimizer == "adam" and typed.budget.optimizer_step == "fused"
    with pytest.raises(memplan.InputError, match=r"^memory=None: a memory budget is required"):
        memplan.solve(prof, "rotor", None)
    with pytest.raises(memplan.InputError, match=r"^gradients='sometimes'"):
        memplan.solve(prof, "rotor", "1MB", gradients="sometimes")


def test_solve_with_trace_draws_the_replay(tmp_path, monkeypatch):
    """`memplan solve --trace` draws the memory curve of the simulator's replay of the plan."""
    from typer.testing import CliRunner

    from memplan.cli.app import app

    calls = []
    real = memplan.api.replay

    def counted(*args):
        calls.append(args[1].algorithm)
        return real(*args)

    monkeypatch.setattr(memplan.api, "replay", counted)
    trace = tmp_path / "t.json"
    result = CliRunner().invoke(
        app, ["solve", "resnet18", "--algo", "rotor", "--mem", "1GB", "--trace", str(trace)]
    )
    assert result.exit_code == 0, result.stderr
    assert calls and set(calls) == {"rotor"} and json.loads(trace.read_text())["traceEvents"]


def test_the_solver_value_is_checked_against_the_replay(monkeypatch):
    """A solver whose own makespan is not its plan's is a bug in memplan (InternalError)."""
    import dataclasses

    from memplan.algorithms import REGISTRY

    info = REGISTRY["store-all"]

    def lying(profile, request):
        sched = info.solve(profile, request)
        return sched.with_solver_makespan(sched.makespan + 1.0)

    monkeypatch.setitem(REGISTRY, "store-all", dataclasses.replace(info, solve=lying))
    with pytest.raises(memplan.InternalError, match="solver value .* != simulated makespan"):
        memplan.solve(random_chain(4, seed=1), "store-all", 10**9, optimizer="none")


def test_each_family_is_named_once():
    """The algorithms get their family's name from their Family, and no entries.py repeats it."""
    from memplan.algorithms import FAMILIES
    from tests.paths import ROOT

    for name, family in FAMILIES.items():
        assert family.name == name
        assert {info.family for info in family.algorithms} == {name}
    for entries in sorted((ROOT / "memplan" / "algorithms").glob("*/entries.py")):
        assert "family=" not in entries.read_text(), entries


def test_a_rotor_solve_loads_no_other_family_solver():
    code = (
        "import sys, memplan\n"
        "memplan.solve('resnet18', 'rotor', '1GB')\n"
        "mods = [m for m in sys.modules if m.startswith('memplan.algorithms.')]\n"
        "other = [m for m in mods if m.split('.')[2] not in ('base', 'options', 'timeline', 'chain')"
        " and not m.endswith('.entries') and m.count('.') > 2]\n"
        "print(other)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- budgets as a share of the GPU ---------------------------------------------------------------


def test_budgets_given_as_the_gpu():
    import warnings

    from memplan.errors import BudgetWarning
    from memplan.units import DEVICE_RESERVE, DeviceShare, parse_budget

    assert parse_budget("8GB") == 8 * 10**9 and parse_budget(" GPU ") == DeviceShare(100.0, "GPU")
    assert parse_budget("90%") == DeviceShare(90.0, "90%")
    prof = memplan.load_profile("resnet50@h100")
    usable = prof.device.memory - DEVICE_RESERVE
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within the GPU: no warning
        assert memplan.solve(prof, "rotor", "gpu").budget.memory == usable
        assert memplan.solve(prof, "rotor", "25%").budget.memory == usable // 4
    with pytest.warns(
        BudgetWarning, match=r"^memory='200GB': 200.00 GB is more than the NVIDIA H100"
    ):
        sched = memplan.solve(prof, "rotor", "200GB")
    assert sched.feasible and sched.budget.memory == 200 * 10**9
    with pytest.warns(BudgetWarning, match=r"^memory='101%'"):
        memplan.solve(prof, "rotor", "101%")
    check = memplan.simulate(prof, memplan.solve(prof, "rotor", "gpu"), memory="gpu")
    assert check.valid and check.budget == usable


def test_a_share_of_no_gpu_is_bad_input():
    with pytest.raises(memplan.InputError, match=r"^memory='90%': .* profiled on a CPU .* 8GB"):
        memplan.solve("resnet18", "rotor", "90%")
    with pytest.raises(memplan.InputError, match="profiled on a synthetic device"):
        memplan.solve(random_chain(3), "rotor", "gpu")
    bare = random_chain(3).model_dump(exclude_none=True)
    del bare["device"]
    with pytest.raises(memplan.InputError, match="names no device"):
        memplan.solve(bare, "rotor", "gpu")


def test_a_denormal_lower_bound_leaves_the_overhead_unset():
    """An offloading plan waits for its transfers: its makespan over a denormal lower bound (the
    stages' times) overflows a float, and the schedule then has no overhead, not inf."""
    from memplan.schedule import overhead_ratio

    assert overhead_ratio(1e-9, 5e-324) is None
    assert overhead_ratio(3.0, 2.0) == 1.5
    assert overhead_ratio(3.0, 0.0) == 1.0
