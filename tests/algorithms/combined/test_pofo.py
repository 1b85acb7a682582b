"""``pofo`` (memplan/algorithms/combined): the DP of NOTE [ pofo recurrences ] and the solver.

* bandwidth 0: the DP is rotor's, at every budget and the same slots;
* memory above the store-all need: pofo reaches the lower bound (no recomputation, no transfer);
* small random chains, one byte per slot: the DP's value equals the exhaustive optimum of its own
  (window, whole-tensor) model, is never below the exhaustive optimum of the general combined model
  (event-driven schedules, tests/oracles/combined.py), and its schedule replays valid, within
  budget, with the simulated makespan equal to the DP's value;
* hypothesis: every plan of ``memplan.solve(..., "pofo")`` replays valid and within budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memplan
import memplan.algorithms.timeline
import memplan.api
from memplan.algorithms.chain import ChainInstance
from memplan.algorithms.chain.rotor import dense_table, plan_rotor, slot_sizes
from memplan.algorithms.combined import solve as combined_solve
from memplan.algorithms.combined.pofo import PofoDP
from memplan.algorithms.combined.solve import (
    EXACT_STAGES,
    FINE_SLOTS,
    FINE_STAGES,
    pofo_window,
    solve_pofo,
)
from memplan.algorithms.offload.model import OffloadInstance
from memplan.errors import InputError
from memplan.profile.model import Profile, Stage
from memplan.schedule import Op
from memplan.simulator import simulate_combined
from tests.oracles.combined import CombinedOracle, window_model_optimum
from tests.oracles.exhaustive import ChainOracle
from tests.strategies import examples, extreme_bandwidths, extreme_chains, integer_chain

RATE = 1000.0  # one byte per ms


def chain_profile(seed: int, length: int) -> Profile:
    return integer_chain(seed, length, max_output=5, max_extra=5, max_input=4, model="rand")


def ops_of(plan) -> list[Op]:
    return [Op(op=n, stage=k, start=a, end=b, stream=s, tensor=t) for n, k, a, b, s, t in plan.ops]


def rotor_dp_value(chain: ChainInstance, memory: int, slots: int) -> float:
    cap, r = slot_sizes(chain, memory - int(chain.x[0]), slots)
    opt = dense_table(chain, cap, r["x"], r["s"], r["g"], r["fo"], r["bo"]).opt
    return float(opt[0, chain.length - 1, cap])


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("slots", [5, 50])
def test_bandwidth_zero_is_rotor(seed, slots):
    prof = chain_profile(seed, 3 + seed % 5)
    chain = ChainInstance.from_profile(prof)
    least = memplan.api.describe(prof, "none")["min_memory"]["chain"]
    top = chain.store_all_peak() + 3
    for memory in range(least, top + 1, max(1, (top - least) // 12)):
        dp = PofoDP(chain, memory, 0.0, slots)
        assert dp.solve() == pytest.approx(rotor_dp_value(chain, memory, slots))
        plan = solve_pofo(chain, memory, bandwidth=0.0, slots=slots)
        rotor = plan_rotor(chain, memory, slots=slots)
        assert plan.claimed_makespan == pytest.approx(rotor.claimed_makespan)


# densenet121@a100 is cut per dense layer (64 stages) since issue 15: pofo's DP in pure Python
# takes about a minute per budget on it at 1 B/s, so the heterogeneous inception_v3@a100 stands in.
@pytest.mark.parametrize("name", ["resnet50@a100", "inception_v3@a100"])
def test_bandwidth_zero_is_rotor_on_bundled_profiles(name):
    prof = memplan.load_profile(name)
    chain = ChainInstance.from_profile(prof)
    desc = memplan.api.describe(prof, "none")
    lo, hi = desc["min_memory"]["chain"], desc["store_all_memory"]
    for i in range(6):
        memory = lo + (hi - lo) * i // 5
        assert PofoDP(chain, memory, 0.0, 50).solve() == pytest.approx(
            rotor_dp_value(chain, memory, 50)
        )
        # through the API, with a bandwidth so low that no transfer can help
        pofo = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=1.0, slots=50)
        rotor = memplan.solve(prof, "rotor", memory, optimizer="none", slots=50)
        assert pofo.makespan == pytest.approx(rotor.makespan)


@pytest.mark.parametrize(
    "name", ["resnet50@a100", pytest.param("densenet121@a100", marks=pytest.mark.slow)]
)
def test_huge_memory_reaches_the_lower_bound(name):
    prof = memplan.load_profile(name)
    big = memplan.api.describe(prof)["store_all_memory"] * 2
    sched = memplan.solve(prof, "pofo", big, bandwidth="12GB/s")
    assert sched.feasible and sched.makespan == pytest.approx(sched.lower_bound)
    assert sched.count("offload") == 0 and sched.count("F_ck") == 0


@pytest.mark.parametrize("seed", range(8))
def test_dp_against_the_oracles(seed, capsys):
    prof = chain_profile(seed, 3)
    chain = ChainInstance.from_profile(prof)
    general = CombinedOracle(prof, RATE)
    least = ChainOracle(prof).min_feasible_memory()
    rows = []
    for memory in range(max(1, least - 4), least + 7, 3):
        slots = memory  # one byte per slot: the DP is exact in memory
        dp = PofoDP(chain, memory, RATE, slots)
        value = dp.solve()
        window = window_model_optimum(prof, memory, RATE)
        if window is None:
            assert value == float("inf")
            continue
        assert value == pytest.approx(window)  # optimal in its own model
        best = general.solve(memory)
        assert best is not None and best[0] <= value + 1e-9  # never below the general optimum
        ops = [
            Op(op=n, stage=k, start=a, end=b, stream=s, tensor=t)
            for n, k, a, b, s, t in dp.schedule()
        ]
        replay = simulate_combined(prof, ops, memory=memory, bandwidth=RATE)
        assert replay.valid, replay.violation
        assert replay.peak_memory <= memory
        assert replay.makespan == pytest.approx(value)
        rows.append((memory, value, replay.makespan, best[0]))
    with capsys.disabled():
        print(f"\nseed {seed}: (budget, DP value, simulated, general optimum)", rows)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    length=st.integers(1, 8),
    fraction=st.floats(0.0, 1.3),
    rate=st.sampled_from([0.5, 2.0, 1000.0, 1e6]),
    slots=st.integers(2, 60),
)
def test_every_plan_replays_valid_within_budget(seed, length, fraction, rate, slots):
    prof = chain_profile(seed, length)
    desc = memplan.api.describe(prof, "none")
    lo = min(desc["min_memory"]["chain"], desc["min_memory"]["offload"])
    memory = int(lo + fraction * (desc["store_all_memory"] - lo))
    # memplan.solve replays the plan and raises InternalError on any disagreement
    sched = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=rate, slots=slots)
    assert sched.feasible
    result = memplan.simulate(prof, sched)
    assert result.valid and result.peak_memory <= memory
    assert sched.makespan >= sched.lower_bound - 1e-9


def test_infeasible_and_slots():
    prof = chain_profile(1, 4)
    desc = memplan.api.describe(prof, "none")
    least = min(desc["min_memory"]["chain"], desc["min_memory"]["offload"])
    sched = memplan.solve(prof, "pofo", 1, optimizer="none", bandwidth=RATE)
    assert not sched.feasible and sched.min_memory == least
    assert memplan.solve(prof, "pofo", least, optimizer="none", bandwidth=RATE).feasible
    slots = memplan.solve(prof, "pofo", least, optimizer="none", bandwidth=RATE).solver.slots
    assert slots in (50, FINE_SLOTS)  # auto: the grid of the Theorem 1 DP that won, else 50
    for bad in (1, 10_001, True):
        with pytest.raises(InputError, match="from 2 to 10000"):
            memplan.solve(prof, "pofo", least, optimizer="none", bandwidth=RATE, slots=bad)
    with pytest.raises(InputError, match="bandwidth"):
        memplan.solve(prof, "pofo", least, optimizer="none")


def test_cli_exit_codes(tmp_path):
    from typer.testing import CliRunner

    from memplan.cli.app import app

    runner = CliRunner()
    ok = runner.invoke(app, ["solve", "resnet50@a100", "--algo", "pofo", "--mem", "4GB"])
    assert ok.exit_code == 0, ok.stderr
    low = runner.invoke(app, ["solve", "resnet50@a100", "--algo", "pofo", "--mem", "1GB"])
    assert low.exit_code == 1 and "GB" in low.stderr
    bad = runner.invoke(
        app, ["solve", "resnet50@a100", "--algo", "pofo", "--mem", "4GB", "--slots", "1"]
    )
    assert bad.exit_code == 2 and "from 2 to 10000" in bad.stderr


def test_defaults_never_slower_than_rotor_and_dynprog():
    """Without --slots (auto): pofo's DPs at 50 slots (and the Theorem 1 DP at 64 too on this
    19-stage chain), its rotor candidate at rotor's default 500, its dynprog one at dynprog's."""
    prof = memplan.load_profile("resnet50@a100")
    for memory in ("2GB", "3GB", "5GB"):
        pofo = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth="12GB/s")
        assert pofo.solver.slots in (50, FINE_SLOTS)
        for algo in ("rotor", "dynprog"):
            other = memplan.solve(prof, algo, memory, optimizer="none", bandwidth="12GB/s")
            if other.feasible:
                assert pofo.makespan <= other.makespan * (1 + 1e-9)


def _pofo_pair(prof: Profile, memory: int, rate: float):
    """pofo at its default (auto) and at the 50-slot grid alone, with the same rotor candidate."""
    chain = ChainInstance.from_profile(prof)
    common = dict(
        bandwidth=rate,
        rotor_slots=500,
        offload_instance=OffloadInstance.from_profile(prof, rate),
    )
    return solve_pofo(chain, memory, **common), solve_pofo(chain, memory, slots=50, **common)


@pytest.mark.parametrize("seed", range(4))
def test_auto_is_never_worse_than_50_slots(seed):
    """Issue 18 item 4: ``--slots auto`` runs the Theorem 1 DP at 64 slots too on short chains and
    keeps the faster schedule, so it is never slower than the 50-slot grid; its plans replay."""
    prof = integer_chain(seed, 6 + seed, max_output=40, max_extra=40, max_input=30, model="auto")
    rate = 4000.0
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
    for i in range(1, 5):
        memory = low + (high - low) * i // 5
        auto, grid = _pofo_pair(prof, memory, rate)
        assert auto.claimed_makespan <= grid.claimed_makespan * (1 + 1e-9)
        if auto.details.get("frac_grids"):
            assert auto.details["frac_grids"] == f"50, {FINE_SLOTS}"
        sched = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=rate)
        assert sched.feasible and sched.peak_memory <= memory
        assert memplan.simulate(prof, sched).valid


@pytest.mark.slow  # a bundled full-size profile: make test-all
def test_auto_recovers_rounding_loss_on_resnet34():
    """resnet34@a100 at 25 GB/s, 1.02 GB (the second budget of docs/benchmarks.md's sweep): the
    50-slot grid's best plan is rotor's (30.77 ms); the Theorem 1 DP at 64 slots finds a combined
    plan 2.1% faster, which auto returns and the simulator replays."""
    prof = memplan.load_profile("resnet34@a100")
    assert prof.length <= FINE_STAGES
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
    memory = round(low + (high - low) * 1 / 19)
    auto, grid = _pofo_pair(prof, memory, 25e9)
    assert auto.claimed_makespan < grid.claimed_makespan * (1 - 0.01)
    assert auto.details["source"] == "frac" and auto.slots == FINE_SLOTS
    sched = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=25e9)
    assert sched.makespan == pytest.approx(auto.claimed_makespan)
    assert memplan.simulate(prof, sched).valid


def test_transfers_of_hours_beside_computations_of_milliseconds():
    """At 1e-3 B/s a transfer lasts 10^7 ms beside computations of a few ms. The combined
    simulator's instants were within a relative 1e-6 of each other, 18 ms at 1.8e7 ms: a whole
    computation's start and end became one instant and pofo's plans were rejected (an internal
    error, exit 70). Every budget from the least memory with offloading to the store-all need
    has a plan, and it replays within the budget."""
    from memplan.algorithms.chain import chain_min_memory
    from memplan.profile.synthetic import random_chain

    prof = random_chain(3, seed=2)
    chain = ChainInstance.from_profile(prof)
    least = OffloadInstance.from_profile(prof, 1e-3).min_memory()
    assert least < chain_min_memory(chain)  # offloading is needed at the lowest budgets
    for memory in range(least, chain.store_all_peak() + 1):
        sched = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=1e-3)
        assert sched.feasible, memory
        assert memplan.simulate(prof, sched).valid


FUZZ = Path(__file__).with_name("fuzz.json")
"""A fuzzed profile: times from 5e-324 to 1000 ms, sizes up to 2**40 bytes, 1e13 B/s in the file."""


def test_fuzzed_profile_replays_valid():
    """The fuzzed profile at 1e14 B/s: dynprog's schedule (which pofo returned) listed ``B 19``
    before ``F_all 19`` (its backward times, computed from the end and shifted, were 1e-12 ms
    early), and the Theorem 1 DP's realized schedule was dropped by the replay. Both now replay;
    the command exits 0 with a plan within the budget."""
    from typer.testing import CliRunner

    from memplan.cli.app import app

    prof = memplan.load_profile(FUZZ)
    memory, rate = 6703252654674, 1e14
    sched = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=rate)
    assert sched.feasible
    result = memplan.simulate(prof, sched)
    assert result.valid and result.peak_memory <= memory
    plan = solve_pofo(
        ChainInstance.from_profile(prof),
        memory,
        bandwidth=rate,
        offload_instance=OffloadInstance.from_profile(prof, rate),
    )
    replay = simulate_combined(
        prof,
        [Op(op=n, stage=k, start=a, end=b, stream=s, tensor=t) for n, k, a, b, s, t in plan.ops],
        memory=memory,
        bandwidth=rate,
    )
    assert replay.valid, replay.violation  # the realization fits by construction
    cli = CliRunner().invoke(
        app,
        ["solve", str(FUZZ), "--algo", "pofo", "--mem", str(memory), "--optimizer", "none"]
        + ["--bandwidth", "100000000000000", "--format", "json"],
    )
    assert cli.exit_code == 0, cli.stderr


def test_prefetch_after_zero_duration_backwards():
    """Every time 0, x[0] and g[2] of 1 MB, a budget of 1.5 MB: x[0] leaves while the forwards run
    and comes back after B 2 and B 1, which hold g[2] at the instant the prefetch starts. The
    combined simulator counted the prefetch during them (prefetches first at an instant) and
    rejected dynprog's plan, which pofo returned (exit 70); an instant now runs in schedule order,
    as in the offloading simulator, and the plan of greedy, dynprog and vdnn is pofo's."""
    blank = dict(forward_time=0.0, backward_time=0.0, output_size=0, saved_size=0)
    stages = [Stage(name=f"s{k}", **blank) for k in range(3)]
    stages[1] = Stage(name="s1", grad_size=1_000_000, **blank)
    prof = Profile(model="zero-times", input_size=1_000_000, stages=stages)
    memory, rate = 1_500_000, 1e9
    sched = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=rate)
    assert sched.feasible and memplan.simulate(prof, sched).valid
    assert sched.peak_memory <= memory
    for algo in ("greedy", "dynprog", "vdnn"):
        other = memplan.solve(prof, algo, memory, optimizer="none", bandwidth=rate)
        assert other.feasible and sched.makespan == pytest.approx(other.makespan)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prof=extreme_chains(), rate=extreme_bandwidths(), data=st.data())
def test_extreme_profiles_replay_valid(prof, rate, data):
    """Denormal and zero times, terabyte sizes, 1e3..1e14 B/s: every plan pofo returns replays
    valid within the budget (``memplan.solve`` replays it and raises on any disagreement), and
    every budget at which recomputing or offloading alone fits has one (recomputing and offloading
    together may fit below both)."""
    desc = memplan.api.describe(prof, "none")
    least = min(desc["min_memory"]["chain"], OffloadInstance.from_profile(prof, rate).min_memory())
    memory = data.draw(st.integers(max(0, least - 1), desc["store_all_memory"] + 1))
    sched = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=rate)
    assert sched.feasible or memory < least
    if sched.feasible:
        result = memplan.simulate(prof, sched)
        assert result.valid and result.peak_memory <= memory


def long_chain(length: int = 60):
    from memplan.profile.synthetic import random_chain

    prof = random_chain(length, seed=3, max_size=10**8)
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
    return prof, low, high


def test_long_chains_run_the_dp_on_a_window_and_are_never_slower():
    """Beyond EXACT_STAGES stages the Theorem 1 DP runs on a window (NOTE [ pofo window ]) and
    looks only for plans faster than rotor's and dynprog's: pofo is never slower than either,
    and its plan replays."""
    prof, low, high = long_chain()
    assert prof.length > EXACT_STAGES
    memory = low + (high - low) // 10
    chain = ChainInstance.from_profile(prof)
    assert 4 <= pofo_window(chain, memory, 50) < prof.length
    pofo = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=12e9)
    assert pofo.feasible and memplan.simulate(prof, pofo).valid
    for algo in ("rotor", "dynprog"):
        other = memplan.solve(prof, algo, memory, optimizer="none", bandwidth=12e9)
        assert pofo.makespan <= other.makespan * (1 + 1e-9)


def test_tables_beyond_the_limit_are_refused(monkeypatch, tmp_path):
    """pofo's DP tables are bounded: beyond TABLE_LIMIT even at the narrowest window, the input is
    refused (exit 2) with a line naming the limit and the --slots that fit."""
    from typer.testing import CliRunner

    from memplan.cli.app import app

    prof, low, high = long_chain()
    monkeypatch.setattr(combined_solve, "TABLE_LIMIT", 10**6)
    memory = low + (high - low) // 10  # where neither rotor nor dynprog reaches the lower bound
    with pytest.raises(
        InputError, match=r"pofo: the DP tables for 60 stages would take .* GB at 50"
    ):
        memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=12e9)
    path = tmp_path / "long.json"
    path.write_text(prof.model_dump_json())
    result = CliRunner().invoke(
        app,
        ["solve", str(path), "--algo", "pofo", "--mem", str(memory)]
        + ["--optimizer", "none", "--bandwidth", "12GB/s"],
    )
    assert result.exit_code == 2
    assert "above the limit of 0.001 GB; use --slots" in result.stderr


def test_time_limit_returns_the_best_plan_so_far():
    """--time-limit: dynprog first (its grids stop, GREEDY's set stands in), then rotor, then the
    DPs, which stop at once; the fastest plan found by then is returned and replays."""
    prof, low, high = long_chain(30)
    memory = low + (high - low) // 10
    sched = memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=12e9, time_limit=1e-6)
    assert sched.feasible and memplan.simulate(prof, sched).valid
    assert sched.solver.status == "feasible"
    plan = solve_pofo(
        ChainInstance.from_profile(prof),
        memory,
        bandwidth=12e9,
        offload_instance=OffloadInstance.from_profile(prof, 12e9),
        deadline=memplan.algorithms.timeline.Deadline.after(1e-6),
    )
    assert plan.details["stopped"] == "time limit"
    assert plan.details["source"] in ("rotor", "dynprog")
    with pytest.raises(InputError, match="^time_limit=0: "):
        memplan.solve(prof, "pofo", memory, optimizer="none", bandwidth=12e9, time_limit=0)
