"""memplan.torch.measure.timing: the median, outliers and the noise figure of timed repeats."""

from __future__ import annotations

import pytest

from memplan.torch.measure.timing import Summary, profile_noise, summarize


def test_summarize_flags_a_preempted_repeat():
    found = summarize([10.0, 10.2, 9.9, 10.1, 35.0])
    assert found.median == 10.1
    assert found.outliers == 1
    # 1.4826 x the median absolute deviation (0.1) over the median: the outlier does not count
    assert found.spread == pytest.approx(1.4826 * 0.1 / 10.1)


def test_small_jitter_is_not_an_outlier():
    # three sigmas of a very regular stage are tiny: the 10% floor keeps 5% off from flagging
    assert summarize([1.0, 1.0, 1.0, 1.0, 1.05]).outliers == 0
    assert summarize([1.0, 1.0, 1.0, 1.0, 1.2]).outliers == 1


@pytest.mark.parametrize("samples", [[], [3.0], [0.0, 0.0]])
def test_degenerate_samples(samples):
    found = summarize(samples)
    assert found.spread == 0.0 and found.outliers == 0


def test_profile_noise_weights_the_stages_by_time():
    a, b = Summary(1.0, 0.10, 0), Summary(3.0, 0.02, 1)
    assert profile_noise([(a, 1.0), (b, 3.0)]) == pytest.approx((0.10 + 3 * 0.02) / 4)
    assert profile_noise([]) == 0.0
