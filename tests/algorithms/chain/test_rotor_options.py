"""rotor with options of F_all (selective checkpointing, docs/model.md "Options of a stage").

* the compiled DP in bytes is its Python reference plan for plan, options included;
* it is optimal: a brute force over the options of every stage (each combination a chain without
  options, searched exhaustively) gives the same least makespan at every budget, and the same
  least memory where no plan fits;
* every plan is replayed by the simulator with its options' sizes and times and fits;
* a profile whose stages have no options solves exactly as before.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest

import memplan
from memplan.algorithms.chain import rotor
from memplan.algorithms.chain.problem import ChainInstance
from memplan.profile.model import Profile
from memplan.profile.synthetic import random_chain
from tests.oracles.exhaustive import ChainOracle, makespan_at
from tests.oracles.rotor import exact_backtrack, exact_frontiers
from tests.strategies import with_options

CASES = [(length, seed) for length in (1, 2, 3) for seed in range(6)] + [
    (4, seed) for seed in range(4)
]


def profile_of(length: int, seed: int) -> Profile:
    base = random_chain(length, seed=300 + 10 * length + seed, integer_times=True)
    return with_options(base, seed=seed)


def one_option_each(prof: Profile, chosen: tuple[int, ...]) -> Profile:
    """The chain whose stage k is stage k run under option ``chosen[k]``, without options."""
    stages = []
    for st, o in zip(prof.stages, chosen, strict=True):
        option = st.option(o)
        stages.append(
            st.model_copy(
                update={
                    "options": None,
                    "saved_size": option.saved_size,
                    "forward_overhead": option.forward_overhead,
                    "backward_overhead": option.backward_overhead,
                    "backward_time": option.backward_time,
                }
            )
        )
    return prof.model_copy(update={"stages": stages})


@functools.cache
def brute_force(length: int, seed: int) -> tuple[Profile, list[list[tuple[int, float]]]]:
    """The profile and, for every combination of options, the persistent oracle's staircase."""
    prof = profile_of(length, seed)
    combos = itertools.product(*(range(st.option_count) for st in prof.stages))
    return prof, [
        ChainOracle(one_option_each(prof, c), persistent=True).makespan_steps() for c in combos
    ]


def best_at(staircases: list[list[tuple[int, float]]], memory: int) -> float | None:
    found = [m for m in (makespan_at(s, memory) for s in staircases) if m is not None]
    return min(found) if found else None


@pytest.mark.parametrize(("length", "seed"), CASES)
def test_rotor_with_options_matches_the_brute_force(length, seed):
    prof, staircases = brute_force(length, seed)
    least = min(s[0][0] for s in staircases)
    top = max(s[-1][0] for s in staircases)
    for memory in range(max(0, least - 2), top + 2):
        best = best_at(staircases, memory)
        sched = memplan.solve(prof, "rotor", memory, optimizer="none")
        where = f"{prof.model} with options at {memory} bytes (brute force: {best})"
        if best is None:
            assert not sched.feasible, where
            assert sched.min_memory == least, where
            continue
        assert sched.feasible, where
        assert math.isclose(sched.makespan, best, abs_tol=1e-9), f"{where}: {sched.makespan}"
        assert sched.peak_memory <= memory, where


def test_options_are_used_and_recorded():
    """Somewhere below the store-all peak a plan runs an F_all under an option, the schedule says
    which, and the replay charges that option's bytes and backward time."""
    used = 0
    for length, seed in CASES:
        prof = profile_of(length, seed)
        chain = ChainInstance.from_profile(prof)
        for memory in range(max(0, chain.store_all_peak() - 12), chain.store_all_peak()):
            sched = memplan.solve(prof, "rotor", memory, optimizer="none")
            if not sched.feasible:
                continue
            chosen = [op for op in sched.ops if op.option]
            for op in chosen:
                assert op.op == "F_all"
                assert 1 <= op.option < prof.stages[op.stage].option_count
                backward = next(b for b in sched.ops if b.op == "B" and b.stage == op.stage)
                want = prof.stages[op.stage].option(op.option).backward_time
                assert math.isclose(backward.end - backward.start, want)
            used += bool(chosen)
    assert used >= 5


@pytest.mark.parametrize("length", [3, 8, 20])
@pytest.mark.parametrize("seed", range(4))
def test_the_core_is_the_reference_with_options(length, seed):
    prof = with_options(random_chain(length, seed=seed, max_size=60), seed=seed, most=3)
    chain = ChainInstance.from_profile(prof)
    assert chain.options is not None or length < 8
    if chain.options is None:
        return
    for fraction in (0.0, 0.3, 0.6, 1.0):
        low = int(chain.x.sum() // 4)
        budget = int(low + fraction * (chain.store_all_peak() - low))
        status, ops, chosen, least = rotor._exact_with_options(chain, budget)
        assert status == 0
        frontiers = exact_frontiers(chain, budget)
        front = frontiers[0][chain.length - 1]
        if front.at(budget) < 0:
            assert ops == [] and least == -1
            continue
        options: dict[int, int] = {}
        assert exact_backtrack(chain, frontiers, budget, options) == ops
        assert options == chosen
        assert least == int(front.memory[0])


@pytest.mark.parametrize(("length", "seed"), CASES[::3])
def test_without_options_nothing_changes(length, seed):
    """Empty option lists are no options: the same plans as the plain profile, every budget."""
    plain = random_chain(length, seed=300 + 10 * length + seed, integer_times=True)
    data = plain.model_dump(exclude_none=True)
    for st in data["stages"]:
        st["options"] = []
    empty = Profile.model_validate(data)
    assert ChainInstance.from_profile(empty).options is None
    peak = ChainInstance.from_profile(plain).store_all_peak()
    for memory in range(peak // 2, peak + 2):
        a = memplan.solve(plain, "rotor", memory, optimizer="none")
        b = memplan.solve(empty, "rotor", memory, optimizer="none")
        assert (a.feasible, a.makespan, a.min_memory) == (b.feasible, b.makespan, b.min_memory)
        assert [(op.op, op.stage, op.option) for op in a.ops or []] == [
            (op.op, op.stage, op.option) for op in b.ops or []
        ]


def test_the_work_limit_leaves_options_out(monkeypatch):
    """Past the DP's work limit, rotor plans with option 0 (a plan that still fits)."""
    prof = with_options(random_chain(6, seed=1, max_size=50), seed=2, most=2)
    chain = ChainInstance.from_profile(prof)
    memory = int(chain.store_all_peak() * 0.8)
    monkeypatch.setattr(rotor, "EXACT_WORK", 1)
    assert rotor._exact_with_options(chain, memory - int(chain.x[0]))[0] == 1  # past the limit
    sched = memplan.solve(prof, "rotor", memory, optimizer="none")
    assert sched.feasible
    assert not any(op.option for op in sched.ops)


@pytest.mark.parametrize(("length", "seed"), CASES[::4])
def test_an_option_that_gains_nothing_is_never_taken(length, seed):
    """An option with the stage's own figures ties with option 0 everywhere: option 0 wins."""
    plain = random_chain(length, seed=300 + 10 * length + seed, integer_times=True)
    data = plain.model_dump(exclude_none=True)
    for st in data["stages"]:
        st["options"] = [
            {
                "name": "same",
                **{
                    k: st.get(k, 0) for k in ("saved_size", "forward_overhead", "backward_overhead")
                },
                "backward_time": st["backward_time"],
            }
        ]
    same = Profile.model_validate(data)
    peak = ChainInstance.from_profile(plain).store_all_peak()
    for memory in range(peak // 2, peak + 2):
        sched = memplan.solve(same, "rotor", memory, optimizer="none")
        assert not any(op.option for op in sched.ops or [])
