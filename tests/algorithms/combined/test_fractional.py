"""pofo's Theorem 1 DP with Lemma 1's fractional transfers (memplan/algorithms/combined/fractional.py)
and the whole-tensor realization of its decisions (realize.py).

* bandwidth 0: the DP is rotor's at every budget and the same number of slots;
* memory above the store-all need: the DP's value is the lower bound (nothing to recompute or move);
* offloading only: the DP's value is never above the exhaustive optimum of papers/004's Problem 2
  (interruptible transfers, the same fractional model), and equals it whenever its plan recomputes
  nothing; pofo is never slower than the best whole-tensor offloading schedule (Problem 1);
* small random chains, one byte per slot (the DP exact in memory), search space of the oracle
  ``window_model_optimum`` (tests/oracles/combined.py): every split of the chain into top-level
  segments (``F_all a``, or ``F_ck a, F_n .. j-1`` keeping ``x[j]``) then a tail, each segment's
  input kept or offloaded *whole* during the segment's forward and prefetched *whole* during the
  next segment's backward, recomputations and tail the persistent chain optimum (Dijkstra) with
  the memory left. The fractional DP's value is never above that optimum (whole-tensor plans are
  fractional plans); the schedule realizing its decisions replays valid, within budget, and is
  never faster than the general optimum of the combined model (``CombinedOracle``: every
  event-driven schedule of the four operations with whole-tensor offloads and prefetches). The
  DP's value and the simulated makespan are printed side by side;
* hypothesis: the realization of every finite DP plan (both roundings) replays valid and within
  budget on random chains, without the safety net of ``solve_pofo``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memplan
import memplan.api
from memplan.algorithms.chain import ChainInstance
from memplan.algorithms.chain.rotor import dense_table, slot_sizes
from memplan.algorithms.combined.fractional import MAX_SLOTS, FractionalDP
from memplan.algorithms.combined.realize import realize
from memplan.algorithms.combined.solve import solve_pofo
from memplan.algorithms.offload.model import OffloadInstance
from memplan.profile.model import Profile
from memplan.schedule import Op
from memplan.simulator import simulate_combined
from tests.oracles.combined import CombinedOracle, window_model_optimum
from tests.oracles.exhaustive import ChainOracle
from tests.oracles.offload import best_fluid, best_real
from tests.strategies import examples, integer_chain

RATE = 1000.0  # one byte per ms


def chain_profile(seed: int, length: int) -> Profile:
    return integer_chain(seed, length, max_output=5, max_extra=5, max_input=4, model="rand")


def rotor_dp_value(chain: ChainInstance, memory: int, slots: int) -> float:
    cap, r = slot_sizes(chain, memory - int(chain.x[0]), slots)
    opt = dense_table(chain, cap, r["x"], r["s"], r["g"], r["fo"], r["bo"]).opt
    return float(opt[0, chain.length - 1, cap])


def realized(prof: Profile, dp: FractionalDP, memory: int, rate: float):
    """Realize the DP's plan and replay it in the combined simulator."""
    chain = ChainInstance.from_profile(prof)
    plan = dp.plan()
    ops = realize(chain, plan.sequence, plan.offloads, plan.prefetches, memory, rate)
    assert ops is not None
    timed = [Op(op=n, stage=k, start=a, end=b, stream=s, tensor=t) for n, k, a, b, s, t in ops]
    replay = simulate_combined(prof, timed, memory=memory, bandwidth=rate)
    assert replay.valid, replay.violation
    assert replay.peak_memory <= memory
    assert replay.makespan == pytest.approx(max(op.end for op in timed))
    return replay.makespan


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("slots", [5, 50])
def test_bandwidth_zero_is_rotor(seed, slots):
    prof = chain_profile(seed, 2 + seed % 6)
    chain = ChainInstance.from_profile(prof)
    least = memplan.api.describe(prof, "none")["min_memory"]["chain"]
    top = chain.store_all_peak() + 3
    for memory in range(least, top + 1, max(1, (top - least) // 10)):
        value = FractionalDP(chain, memory, 0.0, slots).solve()
        assert value == pytest.approx(rotor_dp_value(chain, memory, slots))


@pytest.mark.parametrize(
    "name", ["resnet50@a100", pytest.param("densenet121@a100", marks=pytest.mark.slow)]
)
def test_bandwidth_zero_is_rotor_on_bundled_profiles(name):
    prof = memplan.load_profile(name)
    chain = ChainInstance.from_profile(prof)
    desc = memplan.api.describe(prof, "none")
    lo, hi = desc["min_memory"]["chain"], desc["store_all_memory"]
    for i in range(5):
        memory = lo + (hi - lo) * i // 4
        value = FractionalDP(chain, memory, 0.0, 50).solve()
        assert value == pytest.approx(rotor_dp_value(chain, memory, 50))


@pytest.mark.parametrize("seed", range(6))
def test_store_all_memory_reaches_the_lower_bound(seed):
    prof = chain_profile(seed, 3 + seed % 4)
    chain = ChainInstance.from_profile(prof)
    memory = chain.store_all_peak()
    dp = FractionalDP(chain, memory, RATE, memory)  # one byte per slot: exact
    assert dp.solve() == pytest.approx(chain.lower_bound)
    assert realized(prof, dp, memory, RATE) == pytest.approx(chain.lower_bound)


@pytest.mark.parametrize(
    "seed", [*range(4), *(pytest.param(seed, marks=pytest.mark.slow) for seed in range(4, 8))]
)
def test_dp_against_the_oracles(seed, capsys):
    prof = chain_profile(seed, 3)
    chain = ChainInstance.from_profile(prof)
    general = CombinedOracle(prof, RATE)
    least = ChainOracle(prof).min_feasible_memory()
    rows = []
    for memory in range(max(1, least - 4), least + 7, 2):
        dp = FractionalDP(chain, memory, RATE, memory)  # one byte per slot
        value = dp.solve()
        window = window_model_optimum(prof, memory, RATE)
        if window is not None:
            assert value <= window * (1 + 1e-6)  # whole-tensor window plans are fractional plans
        if value == math.inf:
            continue
        simulated = realized(prof, dp, memory, RATE)
        best = general.solve(memory)
        assert best is not None and best[0] <= simulated + 1e-9
        rows.append((memory, value, simulated, window, best[0]))
    with capsys.disabled():
        print(
            f"\nseed {seed}: (budget, DP value, simulated, window optimum, general optimum)", rows
        )


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    length=st.integers(1, 7),
    fraction=st.floats(0.0, 1.2),
    rate=st.sampled_from([0.5, 3.0, 1000.0, 1e6]),
    slots=st.integers(2, 40),
    nearest=st.booleans(),
)
def test_every_realized_plan_replays_valid_within_budget(
    seed, length, fraction, rate, slots, nearest
):
    prof = chain_profile(seed, length)
    chain = ChainInstance.from_profile(prof)
    desc = memplan.api.describe(prof, "none")
    lo = min(desc["min_memory"]["chain"], desc["min_memory"]["offload"])
    memory = int(lo + fraction * (desc["store_all_memory"] - lo))
    dp = FractionalDP(chain, memory, rate, slots, nearest=nearest, margin=1)
    if dp.solve() == math.inf:
        return
    plan = dp.plan()
    ops = realize(chain, plan.sequence, plan.offloads, plan.prefetches, memory, rate)
    if ops is None:  # only the nearest rounding may overshoot the bytes; the realization says so
        assert nearest
        return
    timed = [Op(op=n, stage=k, start=a, end=b, stream=s, tensor=t) for n, k, a, b, s, t in ops]
    replay = simulate_combined(prof, timed, memory=memory, bandwidth=rate)
    assert replay.valid, replay.violation
    assert replay.peak_memory <= memory


def test_slots_are_capped_and_reported():
    prof = chain_profile(3, 5)
    chain = ChainInstance.from_profile(prof)
    memory = chain.store_all_peak() * 10
    assert FractionalDP(chain, memory, RATE, 5000).slots == MAX_SLOTS
    assert FractionalDP(chain, memory, RATE, 5000).solve() == pytest.approx(chain.lower_bound)
    tight = chain.store_all_peak() - 1  # rotor does not reach the lower bound: the DPs run
    plan = solve_pofo(chain, tight, bandwidth=RATE, slots=5000)
    assert "bound_reached" not in plan.details
    assert plan.details["frac_slots"] == MAX_SLOTS
    assert plan.details["frac_value"] >= chain.lower_bound


def test_a_candidate_at_the_lower_bound_ends_the_search():
    """Store-all fits: rotor's plan reaches the lower bound, nothing can beat it, and neither
    dynprog nor the DPs run (issue 40: pofo costs at most rotor plus dynprog there)."""
    prof = chain_profile(3, 5)
    chain = ChainInstance.from_profile(prof)
    inst = OffloadInstance.from_profile(prof, RATE)
    plan = solve_pofo(chain, chain.store_all_peak(), bandwidth=RATE, offload_instance=inst)
    assert plan.details["bound_reached"] == "rotor" == plan.details["source"]
    assert "dynprog" not in plan.details and "frac_value" not in plan.details
    assert plan.status == "optimal"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rate", [1000.0, 3000.0])
def test_without_recomputation_it_is_the_best_offloading(seed, rate):
    """Offloading-only plans (every forward ``F_all``) are plans of the DP, in the same fractional
    transfer model as papers/004's Problem 2 (interruptible transfers): the DP's value is never
    above the exhaustive optimum of that problem (tests/oracles/offload.py ``best_fluid``), and
    equals it whenever the DP's own plan recomputes nothing. pofo's schedule is never slower than
    the best whole-tensor offloading schedule (``best_real``)."""
    prof = chain_profile(seed, 4)
    chain = ChainInstance.from_profile(prof)
    desc = memplan.api.describe(prof, "none")
    lo, hi = desc["min_memory"]["offload"], desc["store_all_memory"]
    for memory in range(lo, hi + 1, max(1, (hi - lo) // 4)):
        fluid, real = best_fluid(prof, rate, memory), best_real(prof, rate, memory)
        assert fluid is not None and real is not None
        dp = FractionalDP(chain, memory, rate, memory)  # one byte per slot
        value = dp.solve()
        assert value <= fluid[0] * (1 + 1e-6)  # the forward table is float32
        if not any(name == "F_ck" for name, _ in dp.plan().sequence):
            assert value == pytest.approx(fluid[0])
        plan = solve_pofo(chain, memory, bandwidth=rate, slots=memory)
        assert plan.claimed_makespan <= real[0] + 1e-6


def _solved(chain: ChainInstance, memory: int, rate: float, **kwargs):
    dp = FractionalDP(chain, memory, rate, 50, nearest=True, margin=1, **kwargs)
    value = dp.solve()
    plan = dp.plan() if value < math.inf else None
    return value, None if plan is None else (plan.sequence, plan.offloads, plan.prefetches)


@pytest.mark.parametrize(
    "seed", [*range(3), *(pytest.param(seed, marks=pytest.mark.slow) for seed in range(3, 6))]
)
def test_pruning_keeps_the_value_and_the_plan(seed):
    """NOTE [ pofo pruning ]: with a bound, the states whose time so far plus the relaxed lower
    bound exceed a plan known are skipped; the DP's value and plan are those without a bound
    whenever the bound is not below the value (inf when it is)."""
    from memplan.profile.synthetic import random_chain

    prof = random_chain(12 + seed, seed=seed, max_size=10**8)
    chain = ChainInstance.from_profile(prof)
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
    for fraction in (0.05, 0.3):
        memory = round(low + (high - low) * fraction)
        for rate in (1.2e9, 12e9):
            value, plan = _solved(chain, memory, rate)
            if value == math.inf:
                continue
            for bound in (1e18, value * (1 + 1e-4)):
                assert _solved(chain, memory, rate, bound=bound) == (value, plan)
            assert _solved(chain, memory, rate, bound=value * 0.99)[0] == math.inf


@pytest.mark.parametrize("seed", range(4))
def test_a_window_as_long_as_the_chain_is_the_full_dp(seed):
    """NOTE [ pofo window ]: the window restricts the plans (its value is never below the full
    DP's), and a window of the chain's length is the full DP."""
    from memplan.profile.synthetic import random_chain

    prof = random_chain(10 + seed, seed=seed, max_size=10**8)
    chain = ChainInstance.from_profile(prof)
    desc = memplan.api.describe(prof, "none")
    memory = round(desc["min_memory"]["chain"] * 0.8 + desc["store_all_memory"] * 0.2)
    full = _solved(chain, memory, 12e9)
    assert _solved(chain, memory, 12e9, window=chain.length) == full
    for window in (1, 2, 4):
        assert _solved(chain, memory, 12e9, window=window)[0] >= full[0] - 1e-6


@pytest.mark.parametrize(
    ("length", "seed", "slots", "fraction"), [(60, 1, 12, 0.05), (80, 2, 8, 0.1)]
)
def test_on_a_window_sizes_rounded_up_when_the_nearest_slot_gives_nothing_that_fits(
    length, seed, slots, fraction
):
    """NOTE [ pofo on long chains ]: where tensors are a fraction of a slot, rounding them to the
    nearest slot counts many as free and every plan it finds needs more than the budget; the DP
    then runs with sizes rounded up (even beside rotor's finer grid: that DP only looks for plans
    faster than rotor's), and such a plan fits (replayed by the combined simulator)."""
    from memplan.profile.synthetic import random_chain

    prof = random_chain(length, seed=seed, max_size=10**8)
    chain = ChainInstance.from_profile(prof)
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
    memory = round(low + (high - low) * fraction) - desc["static_memory"]
    plan = solve_pofo(chain, memory, bandwidth=12e9, slots=slots, rotor_slots="auto")
    assert plan.details["window"] < length
    assert plan.details["frac_rounding"] == "up"
    replay = simulate_combined(
        prof,
        [Op(op=n, stage=k, start=a, end=b, stream=s, tensor=t) for n, k, a, b, s, t in plan.ops],
        memory=memory,
        bandwidth=12e9,
    )
    assert replay.valid, replay.violation  # the realization fits by construction
    if "frac" in plan.details:  # a rounded-up plan faster than rotor's
        assert plan.details["frac"] < math.inf
