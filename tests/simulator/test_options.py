"""The chain simulator replays an ``F_all`` under an option of its stage (docs/model.md,
"Options of a stage") with the option's sizes and times, counted by hand."""

from __future__ import annotations

from memplan.api import timed_ops
from memplan.profile.model import Profile, StageOption
from memplan.schedule import Op
from memplan.simulator import simulate_chain
from tests.simulator.test_chain import STORE_ALL, three_stages


def with_option() -> Profile:
    """three_stages() whose stage 1 may save 4 bytes instead of 7, needing 2 more bytes in its
    backward (bo 3) and taking 3 ms longer (bt 7)."""
    prof = three_stages()
    stages = list(prof.stages)
    option = StageOption(
        name="save-matmuls", saved_size=4, forward_overhead=1, backward_overhead=3, backward_time=7
    )
    stages[1] = stages[1].model_copy(update={"options": [option]})
    return prof.model_copy(update={"stages": stages})


def test_an_option_changes_the_bytes_and_the_backward_time():
    prof = with_option()
    ops = timed_ops(prof, STORE_ALL, {1: 1})
    assert [op.option for op in ops] == [None, 1, None, None, None, None]
    result = simulate_chain(prof, ops)
    assert result.valid, result.violation
    # held before -> peak during -> held after, from 3 (x0 2, g3 1):
    #   F_all 0: 3 + 5 + 1 = 9 -> 8; F_all 1 (option 1): 8 + 4 + fo 1 = 13 -> 12;
    #   F_all 2: 12 + 2 + 2 = 16 -> 14; B 2: 14 + 4 + 0 = 18 -> 14 + 4 - 1 - 2 = 15;
    #   B 1: 15 + 3 + bo 3 = 21 -> 15 + 3 - 4 - 4 = 10; B 0: 10 + 0 + 2 = 12 -> 0
    assert result.op_peaks == [9, 13, 16, 18, 21, 12]
    assert result.makespan == 1 + 3 + 5 + 6 + 7 + 2
    plain = simulate_chain(prof, STORE_ALL)
    assert plain.peak_memory == 22 and result.peak_memory == 21


def test_an_unknown_option_is_refused():
    prof = with_option()
    ops = timed_ops(prof, STORE_ALL)
    ops[0] = Op(op="F_all", stage=0, start=0.0, end=1.0, option=1)
    result = simulate_chain(prof, ops)
    assert not result.valid
    assert "no such option 1" in (result.violation or "")


def test_the_makespan_stated_must_be_the_options():
    """A B whose stated time is option 0's while its F_all ran option 1 is refused."""
    prof = with_option()
    ops = timed_ops(prof, STORE_ALL, {1: 1})
    plain = timed_ops(prof, STORE_ALL)
    ops = [ops[0], ops[1], *plain[2:]]
    result = simulate_chain(prof, ops)
    assert not result.valid
    assert "ops[4]" in (result.violation or ""), result.violation
