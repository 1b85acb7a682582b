"""The chain-model simulator under the combined family's rules (memplan/simulator/combined.py,
docs/combined.md).

* Without transfers a combined schedule is a chain plan: every chain algorithm's plan replays
  with the same makespan and peak as under the chain family's rules (run back to back, the stated
  times only checked), and broken plans are rejected by both.
* With every forward ``F_all`` it is an offloading schedule: every offloading algorithm's schedule
  replays with the same makespan, idle time and peak as under the offloading family's rules.
* Hand-made schedules mixing recomputation and transfers, and one broken rule per test.
"""

from __future__ import annotations

import random

import pytest

import memplan
import memplan.api
from memplan.profile.model import Profile, Stage
from memplan.schedule import Op
from memplan.simulator import simulate_chain, simulate_combined, simulate_offload

RATE = 1000.0  # one byte per ms


def random_profile(rng: random.Random, length: int) -> Profile:
    stages = []
    for k in range(length):
        out = rng.randint(1, 6)
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=float(rng.randint(1, 5)),
                backward_time=float(rng.randint(1, 8)),
                output_size=out,
                saved_size=out + rng.randint(0, 6),
                forward_overhead=rng.randint(0, 2),
                backward_overhead=rng.randint(0, 2),
            )
        )
    return Profile(model="rand", input_size=rng.randint(1, 5), stages=stages)


def replay(profile, ops, memory=None):
    return simulate_combined(profile, ops, memory=memory, bandwidth=RATE)


@pytest.mark.parametrize("seed", range(20))
def test_chain_plans_replay_as_in_the_chain_simulator(seed):
    rng = random.Random(seed)
    prof = random_profile(rng, rng.randint(2, 6))
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["chain"], desc["store_all_memory"]
    for algo in ("rotor", "store-all", "periodic", "revolve"):
        sched = memplan.solve(prof, algo, rng.randint(low, high), optimizer="none", slots=50)
        if not sched.feasible:
            continue
        ref = simulate_chain(prof, sched.ops)
        got = replay(prof, sched.ops)
        assert got.valid and ref.valid
        assert got.makespan == pytest.approx(ref.makespan)
        assert got.peak_memory == ref.peak_memory == sched.peak_memory
        assert got.op_peaks == ref.op_peaks
        assert got.idle_time == pytest.approx(0.0)


@pytest.mark.parametrize("seed", range(10))
def test_broken_chain_plans_are_rejected_by_both(seed):
    rng = random.Random(100 + seed)
    prof = random_profile(rng, 4)
    sched = memplan.solve(
        prof, "rotor", memplan.api.describe(prof, "none")["min_memory"]["chain"], optimizer="none"
    )
    seq = [(op.op, op.stage) for op in sched.ops]
    i = rng.randrange(len(seq))
    seq[i] = (rng.choice(["F_all", "F_ck", "F_n", "B"]), rng.randrange(4))
    ops = memplan.api.timed_ops(prof, seq)
    assert simulate_chain(prof, ops).valid == replay(prof, ops).valid


@pytest.mark.parametrize("algo", ["greedy", "dynprog", "vdnn"])
@pytest.mark.parametrize("seed", range(8))
def test_offload_schedules_replay_as_in_the_offload_simulator(algo, seed):
    rng = random.Random(seed)
    prof = random_profile(rng, rng.randint(2, 6))
    desc = memplan.api.describe(prof, "none")
    low, high = desc["min_memory"]["offload"], desc["offload_peak"]
    sched = memplan.solve(prof, algo, rng.randint(low, high), optimizer="none", bandwidth=RATE)
    assert sched.feasible
    ref = simulate_offload(prof, sched.ops, bandwidth=RATE, memory=sched.budget.memory)
    got = replay(prof, sched.ops, memory=sched.budget.memory)
    assert ref.valid and got.valid, got.violation
    assert got.makespan == pytest.approx(ref.makespan)
    assert got.idle_time == pytest.approx(ref.idle_time)
    assert got.peak_memory == ref.peak_memory


def test_api_simulate_dispatches_combined(chain):
    sched = memplan.solve(chain, "greedy", 30, optimizer="none", bandwidth=RATE)
    combined = sched.model_copy(update={"family": "combined"})
    result = memplan.simulate(chain, combined)
    assert result.valid and result.makespan == pytest.approx(sched.makespan)
    with pytest.raises(memplan.errors.InputError, match="bandwidth"):
        memplan.simulate(
            chain,
            combined.model_copy(
                update={"budget": combined.budget.model_copy(update={"bandwidth": None})}
            ),
        )


def mixed(chain) -> list[Op]:
    """F_ck 0 keeps x[1]; x[1] goes to the host while F_all 1..3 run and comes back during the
    backward of stages 3 and 2, in time for B 1; F_all 0 recomputes s[0] from x[0] for B 0.
    x[1] is 4 bytes: 4 ms on the channel."""

    def c(name, k, start):
        st = chain.stages[k]
        d = st.backward_time if name == "B" else st.forward_time
        return Op(op=name, stage=k, start=start, end=start + d)

    def t(name, start):
        return Op(op=name, stage=0, start=start, end=start + 4, stream="transfer", tensor="x[1]")

    return [
        c("F_ck", 0, 0.0),
        t("offload", 2.0),  # overlaps F_all 1, which reads x[1]: x[1] leaves at 6.0 (T2)
        c("F_all", 1, 2.0),
        c("F_all", 2, 4.0),
        c("F_all", 3, 6.0),
        c("B", 3, 8.0),
        t("prefetch", 8.0),
        c("B", 2, 11.0),
        c("B", 1, 14.0),
        c("F_all", 0, 17.0),
        c("B", 0, 19.0),
    ]


def test_mixed_schedule(chain):
    result = replay(chain, mixed(chain))
    assert result.valid, result.violation
    assert result.makespan == pytest.approx(22.0)
    assert result.idle_time == pytest.approx(0.0)
    # op_peaks: one per operation, in the schedule's order (ops[3] is F_all 2, ...)
    # F_all 2 (4..6): x[0] 5 + g[4] 4 + x[1] 4 (offloading) + s[1] 8 + s[2] 8 + 1 = 30
    assert result.op_peaks[3] == 30
    # F_all 3 (6..8): x[1] has left at 6.0: 5 + 4 + 8 + 8 + 8 + 1 = 34
    assert result.op_peaks[4] == 34
    # B 3 (8..11): 5 + 4 + 24 + g[3] 4 + 2, then x[1] reserved from 8.0: 43
    assert result.op_peaks[5] == 43
    # the offload of x[1] (2..6) runs while F_all 1 and F_all 2 do: at most 30 then
    assert result.op_peaks[1] == 30
    assert result.peak_memory == 43
    assert replay(chain, mixed(chain), memory=43).valid
    assert "budget 42" in replay(chain, mixed(chain), memory=42).violation


def broken(ops, index, **update):
    ops = list(ops)
    ops[index] = ops[index].model_copy(update=update)
    return ops


def test_prefetch_too_late(chain):
    # the prefetch ends at 15.0, after B 1 starts at 14.0
    ops = broken(mixed(chain), 6, start=11.0, end=15.0)
    result = replay(chain, ops)
    assert not result.valid and "B stage 1: x[1] is not on the GPU" in result.violation


def test_offload_before_it_exists(chain):
    ops = broken(mixed(chain), 1, start=1.0, end=5.0)
    assert replay(chain, ops).violation == "ops[1] offload x[1]: x[1] does not exist yet"


def test_offload_ends_before_a_reader_starts(chain):
    # the offload ends at 6.0; if F_all 1 only starts at 6.0, x[1] is gone
    ops = mixed(chain)
    ops = broken(ops, 1, start=1.0 + 1.0, end=6.0)
    ops = [
        op.model_copy(update={"start": op.start + 4, "end": op.end + 4})
        if op.stream == "compute" and op.start >= 2.0
        else op
        for op in ops
    ]
    ops = broken(ops, 6, start=12.0, end=16.0)
    assert "F_all stage 1: x[1] is not on the GPU" in replay(chain, ops).violation


def test_two_transfers_at_once(chain):
    ops = broken(mixed(chain), 6, start=5.0, end=9.0)
    assert "one transfer at a time" in replay(chain, ops).violation


def test_wrong_duration_and_stream(chain):
    assert "duration" in replay(chain, broken(mixed(chain), 6, end=13.0)).violation
    assert "stream" in replay(chain, broken(mixed(chain), 6, stream="compute")).violation
    assert (
        "no such stored tensor" in replay(chain, broken(mixed(chain), 6, tensor="g[1]")).violation
    )


def test_compute_overlap(chain):
    assert replay(chain, broken(mixed(chain), 3, start=3.0, end=5.0)).violation == (
        "ops[3] F_all stage 2: starts at 3.0, before the end 4.0 of ops[2] "
        "(one computation at a time)"
    )


def test_free_while_offloading(chain):
    # offload s[3] during B 3, which frees s[3]: forbidden (T4)
    ops = mixed(chain)
    ops.insert(6, Op(op="offload", stage=3, start=8.0, end=16.0, stream="transfer", tensor="s[3]"))
    ops = [op for op in ops if op.op != "prefetch"]
    assert "while it is offloading" in replay(chain, ops).violation


def test_idle_time(chain):
    ops = [
        op.model_copy(update={"start": op.start + 1, "end": op.end + 1})
        if op.stream == "compute" and op.start >= 19.0
        else op
        for op in mixed(chain)
    ]
    result = replay(chain, ops)
    assert result.valid and result.idle_time == pytest.approx(1.0)


def test_an_instant_runs_in_schedule_order():
    """T5: at one instant, the starts and the zero-duration operations take effect in the order
    the schedule lists them. Every time 0, x[0] and g[2] of 10 bytes: B 2 and B 1 hold g[2] at the
    instant x[0]'s prefetch starts; listed after them, the prefetch does not coexist with them
    (under the offloading family's rules too), listed before them it does."""
    blank = dict(forward_time=0.0, backward_time=0.0, output_size=0, saved_size=0)
    stages = [Stage(name=f"s{k}", **blank) for k in range(3)]
    stages[1] = Stage(name="s1", grad_size=10, **blank)
    prof = Profile(model="zero-times", input_size=10, stages=stages)

    def c(name, k, at):
        return Op(op=name, stage=k, start=at, end=at)

    def t(name, at):
        return Op(op=name, stage=0, start=at, end=at + 10, stream="transfer", tensor="x[0]")

    forward = [c("F_all", 0, 0.0), c("F_all", 1, 0.0), c("F_all", 2, 0.0), t("offload", 0.0)]
    after = forward + [c("B", 2, 10.0), c("B", 1, 10.0), t("prefetch", 10.0), c("B", 0, 20.0)]
    before = forward + [t("prefetch", 10.0), c("B", 2, 10.0), c("B", 1, 10.0), c("B", 0, 20.0)]
    assert replay(prof, after, memory=15).valid
    assert simulate_offload(prof, after, bandwidth=RATE, memory=15).valid
    assert "needs 20 bytes, budget 15 bytes" in replay(prof, before, memory=15).violation
