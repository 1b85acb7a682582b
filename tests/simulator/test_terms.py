"""The simulator's memory terms are its own (NOTE [ simulator memory terms ] in
memplan/simulator/terms.py): written from docs/model.md apart from the solvers' (memplan/profile/
memory.py), they agree with them on random profiles, and a solver whose terms are wrong is
caught: its plan is rejected by the replay (memplan.solve raises InternalError), whichever term
is wrong (a saved tensor, the weight gradients, the static memory, the optimizer's step after or
in the backward, the output the caller holds) and whichever family made it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest

import memplan
import memplan.algorithms.chain.problem as chain_problem
import memplan.algorithms.offload.model as offload_model
import memplan.algorithms.timeline as timeline
import memplan.loop as loop_names
from memplan.errors import InternalError
from memplan.loop import Optimizer, parse_optimizer
from memplan.profile.memory import parameter_sizes, stage_terms, static_bytes
from memplan.profile.model import Profile, Stage
from memplan.profile.synthetic import random_chain
from memplan.schedule import Budget, Op
from memplan.simulator import terms
from tests.paths import ROOT
from tests.strategies import with_loop_terms

LOOPS = (None, "at-backward", "kept", "step-in-backward")
OPTIMIZERS = (
    "none",
    "sgd",
    "sgd:foreach+copy",
    "momentum",
    "momentum:fused",
    "adam:for-loop",
    "adamw:foreach",
    "adamw:for-loop+copy",
    "adam:fused",
)
"""Every optimizer's state, and every kind of step (NOTE [ optimizer step temporaries ])."""


@functools.cache
def measured(length: int, seed: int) -> Profile:
    """A random chain with every field of a measured profile (weights, loop terms, frees, the
    gradients each stage completes, the order of the parameters, weights in no stage, a tensor
    every block reads whose gradient they sum)."""
    prof = with_loop_terms(random_chain(length, seed=seed, overheads=True), seed)
    sizes = [size for st in prof.stages for size in (st.weight_grad_size or 0, 1 + seed % 3)]
    return prof.model_copy(
        update={
            "parameter_sizes": [*sizes[:3], 0, *sizes[3:]],
            "unreached_weight_size": 3 + seed,
            "side_gradient_size": 5 + seed,
        }
    )


def budget_of(optimizer: str, loop: str | None, held: bool | int = False) -> Budget:
    """The schedule's budget of a plan for ``optimizer`` in ``loop`` (``held``: the caller holds
    the output; a number, the bytes it holds)."""
    found = parse_optimizer(optimizer)
    return Budget(
        optimizer=found.name,
        optimizer_step=found.step,
        optimizer_copies_grads=found.copies_grads or None,
        gradients=loop,
        output_held=bool(held) or None,
        output_bytes=None if isinstance(held, bool) else held,
    )


def test_the_simulator_imports_no_solver_code():
    """No module of memplan/simulator imports the solvers' memory terms, the loop's step
    temporaries (memplan.loop) or any algorithm."""
    forbidden = ("memplan.algorithms", "memplan.profile.memory", "memplan.loop")
    for path in sorted((ROOT / "memplan" / "simulator").glob("*.py")):
        tree = ast.parse(Path(path).read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"


def test_every_optimizer_of_the_format_is_known():
    """The simulator counts the state of every optimizer a schedule may name."""
    assert terms.STATE_COPIES == loop_names.STATE_COPIES
    assert terms.SCALARS == loop_names.STEP_SCALARS


@pytest.mark.parametrize("held", [False, True, 5])
@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("seed", range(4))
def test_the_two_accountings_agree(seed, optimizer, loop, held):
    """Written apart, from the same document: the same bytes on random measured profiles, for
    every optimizer and step, every loop, the output held or not. The solvers fold the step in
    the backward into a stage's terms; the simulator keeps it apart."""
    prof = measured(6, seed).model_copy(update={"workspace_size": 7 * seed})
    budget = budget_of(optimizer, loop, held)
    solver = stage_terms(prof.stages, budget.loop)
    mine = terms.stage_loops(prof.stages, budget)
    assert [t.forward_all for t in mine] == solver.forward_all
    in_backward = [t.steps + t.step_temporaries for t in mine]
    assert in_backward == solver.in_backward
    assert [t.backward + b for t, b in zip(mine, in_backward, strict=True)] == solver.backward
    assert [t.weight_grads - t.steps for t in mine] == solver.weight_grads
    assert [t.frees_input for t in mine] == solver.freed_input
    assert terms.static_memory(prof, budget) == static_bytes(prof, budget.loop)
    step = terms.step_temporaries(prof, budget)
    if budget.loop.counts_step:
        assert step == budget.loop.optimizer.step_temporaries(parameter_sizes(prof))
    else:
        assert step is None


def test_the_random_profiles_exercise_every_term():
    budget = budget_of("adam:for-loop", "step-in-backward")
    loops = [terms.stage_loops(measured(6, s).stages, budget) for s in range(6)]
    assert any(t.frees_input for loop in loops for t in loop)
    let_go = [  # B k without x[k+1], which the next stage kept and its backward freed
        (prof.stages[k], prof.stages[k + 1])
        for prof in (measured(6, s) for s in range(6))
        for k in range(5)
    ]
    assert any(a.output_saved is False and b.input_saved for a, b in let_go)
    assert any(t.weight_grads for loop in loops for t in loop)
    assert any(t.backward < 0 for loop in loops for t in loop)
    assert any(t.steps != t.weight_grads for loop in loops for t in loop)  # a shared gradient
    assert any(t.step_temporaries for loop in loops for t in loop)
    stepping = {
        terms.step_temporaries(measured(6, s), budget_of(o, "kept"))
        for s in range(4)
        for o in OPTIMIZERS
    }
    assert len(stepping) > 4  # the kinds of step differ


# ---- a solver with a wrong term is caught ---------------------------------------------------


def _store_all_need(prof: Profile, loop: str, algo: str, optimizer: str = "sgd") -> int:
    """The budget the (possibly faulty) solvers of ``algo``'s family say store-all needs."""
    desc = memplan.api.describe(prof, optimizer, loop)
    offloading = algo in ("greedy", "dynprog", "vdnn")
    return int(desc["offload_peak" if offloading else "store_all_memory"])


def _solve_everywhere(prof: Profile, loop: str, algo: str, optimizer: str = "sgd") -> None:
    """Solve at the faulty solver's own store-all need (the plan it thinks just fits)."""
    budget = _store_all_need(prof, loop, algo, optimizer)
    memplan.solve(prof, algo, budget, gradients=loop, optimizer=optimizer, bandwidth=1e9)


def _one_saved_tensor_less(original):
    """``ChainInstance._arrays`` with every saved tensor ``s[k]`` missing its output ``x[k+1]``: the
    solver's stage terms off by one saved tensor."""

    def faulty(input_size, stages):
        arrays = original(input_size, stages)
        arrays["s"] = arrays["s"] - arrays["x"][1:]
        return arrays

    return staticmethod(faulty)


@pytest.mark.parametrize("loop", ["at-backward", "kept", "step-in-backward"])
@pytest.mark.parametrize("algo", ["store-all", "rotor", "pofo"])
def test_a_saved_tensor_missing_from_the_solver_is_caught(monkeypatch, algo, loop):
    prof = measured(5, 3).model_copy(update={"bandwidth": 1e9})
    _solve_everywhere(prof, loop, algo)  # the true terms: accepted
    monkeypatch.setattr(
        chain_problem.ChainInstance,
        "_arrays",
        _one_saved_tensor_less(chain_problem.ChainInstance._arrays),
    )
    with pytest.raises(InternalError, match="simulator rejects"):
        _solve_everywhere(prof, loop, algo)


def _without_weight_gradients(original):
    def faulty(stages, loop):
        found = original(stages, loop)
        return dataclasses.replace(found, weight_grads=[0] * len(stages))

    return faulty


@pytest.mark.parametrize(
    ("module", "algo"),
    [(chain_problem, "rotor"), (offload_model, "greedy"), (offload_model, "dynprog")],
)
def test_weight_gradients_missing_from_the_solver_are_caught(monkeypatch, module, algo):
    """Under ``at-backward`` the solver forgets the weight gradients each backward creates
    (large here: the peak is in the backward)."""
    prof = _heavy(measured(5, 2))
    _solve_everywhere(prof, "at-backward", algo)
    monkeypatch.setattr(module, "stage_terms", _without_weight_gradients(stage_terms))
    with pytest.raises(InternalError, match="simulator rejects"):
        _solve_everywhere(prof, "at-backward", algo)


def _heavy(prof: Profile) -> Profile:
    """``prof`` with weights large beside its activations: the gradients, the optimizer's state
    and its step set the peak."""
    heavy = [
        st.model_copy(
            update={
                "weight_size": 50,
                "weight_grad_size": 50,
                "first_use_grad_size": 50,
                "largest_grad_size": 30,
            }
        )
        for st in prof.stages
    ]
    return prof.model_copy(update={"bandwidth": 1e9, "stages": heavy, "parameter_sizes": None})


@pytest.mark.parametrize(
    ("loop", "optimizer"),
    [("at-backward", "adamw:foreach"), ("kept", "adam:for-loop"), ("step-in-backward", "adam")],
)
@pytest.mark.parametrize("algo", ["rotor", "greedy", "pofo"])
def test_an_optimizer_step_wrong_in_the_solver_is_caught(monkeypatch, algo, loop, optimizer):
    """The solvers forget the optimizer step's temporaries (memplan/loop.py): after the
    backward (``at-backward``, ``kept``), or in each backward (``step-in-backward``, Adam's
    for-loop step, one parameter at a time). Every family's plan at the faulty need is rejected:
    the simulator computes the step itself (NOTE [ simulator memory terms ])."""
    prof = _heavy(measured(5, 2))
    chosen = optimizer if ":" in optimizer else f"{optimizer}:for-loop"
    _solve_everywhere(prof, loop, algo, chosen)
    monkeypatch.setattr(Optimizer, "step_temporaries", lambda self, sizes: 0)
    with pytest.raises(InternalError, match="simulator rejects"):
        _solve_everywhere(prof, loop, algo, chosen)


def test_static_memory_too_small_in_the_solver_is_caught(monkeypatch):
    """The solvers' static memory one weight copy short: the replay counts its own."""
    prof = measured(5, 1)
    budget = _store_all_need(prof, "kept", "rotor")
    memplan.solve(prof, "rotor", budget, gradients="kept")

    def faulty(profile, loop):
        return static_bytes(profile, loop) - profile.weight_size

    monkeypatch.setattr(timeline, "static_bytes", faulty)
    with pytest.raises(InternalError, match="simulator rejects"):
        memplan.solve(prof, "rotor", budget - prof.weight_size, gradients="kept")


def test_weights_outside_every_stage_missing_from_the_solver_are_caught(monkeypatch):
    """The solvers' static memory without the weights no stage holds (``unreached_weight_size``,
    a tower the batch never reaches): the replay counts them itself."""
    prof = measured(5, 1).model_copy(update={"unreached_weight_size": 10**5})
    budget = _store_all_need(prof, "at-backward", "rotor")
    memplan.solve(prof, "rotor", budget, gradients="at-backward")

    def faulty(profile, loop):
        return static_bytes(profile, loop) - (profile.unreached_weight_size or 0)

    monkeypatch.setattr(timeline, "static_bytes", faulty)
    with pytest.raises(InternalError, match="simulator rejects"):
        memplan.solve(prof, "rotor", budget - 10**5, gradients="at-backward")


def test_a_side_inputs_gradient_missing_from_the_solver_is_caught(monkeypatch):
    """The solvers' static memory without a tensor every block reads and its summed gradient
    (``side_gradient_size``, NOTE [ A side input with a gradient ]): the replay counts them."""
    prof = measured(5, 1).model_copy(update={"side_gradient_size": 10**5})
    budget = _store_all_need(prof, "at-backward", "rotor")
    memplan.solve(prof, "rotor", budget, gradients="at-backward")

    def faulty(profile, loop):
        return static_bytes(profile, loop) - 3 * (profile.side_gradient_size or 0)

    monkeypatch.setattr(timeline, "static_bytes", faulty)
    with pytest.raises(InternalError, match="simulator rejects"):
        memplan.solve(prof, "rotor", budget - 3 * 10**5, gradients="at-backward")


def test_a_held_output_wrong_in_the_solver_is_caught(monkeypatch):
    """The solvers' static memory without the output the caller holds."""
    prof = measured(5, 1)
    memplan.solve(prof, "rotor", 10**6, gradients="at-backward", output_held=True)

    def faulty(profile, loop):
        return static_bytes(profile, dataclasses.replace(loop, output_held=False))

    monkeypatch.setattr(timeline, "static_bytes", faulty)
    with pytest.raises(InternalError, match="simulator rejects"):
        budget = _store_all_need(prof, "at-backward", "rotor")
        memplan.solve(prof, "rotor", budget, gradients="at-backward", output_held=True)


def test_a_tensor_autograd_frees_is_never_transferred():
    """T6 of docs/combined.md: where ``F_all 1`` frees ``x[1]``, neither ``s[0]`` (which holds
    it) nor a standalone ``x[1]`` moves."""
    stages = [
        Stage(name=f"s{k}", forward_time=1.0, backward_time=1.0, output_size=4, saved_size=6)
        for k in range(2)
    ]
    stages[0] = stages[0].model_copy(update={"output_saved": False})
    stages[1] = stages[1].model_copy(update={"input_saved": False})
    prof = Profile(model="frees", input_size=4, stages=stages)
    ops = [
        Op(op="F_all", stage=0, start=0.0, end=1.0),
        Op(op="F_all", stage=1, start=1.0, end=2.0),
        Op(op="offload", stage=0, start=1.0, end=2.0, stream="transfer", tensor="s[0]"),
        Op(op="B", stage=1, start=2.0, end=3.0),
        Op(op="prefetch", stage=0, start=3.0, end=4.0, stream="transfer", tensor="s[0]"),
        Op(op="B", stage=0, start=4.0, end=5.0),
    ]
    loop = simulate_combined_loop(prof, ops, "kept")
    assert not loop.valid and "s[0] cannot be transferred" in loop.violation
    before = simulate_combined_loop(prof, ops, None)  # before the loop's terms: no free, and
    assert "cannot be transferred" not in (before.violation or "")  # B 1 then reads s[0]


def simulate_combined_loop(prof: Profile, ops: list[Op], loop: str | None):
    from memplan.simulator.combined import simulate_ops

    return simulate_ops(prof, ops, bandwidth=6000.0, budget=Budget(gradients=loop))
