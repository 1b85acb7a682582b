"""Robust statistics of timed repeats: the median, outliers, and a profile's noise figure.

A stage's time is the median of its timed iterations; on a machine shared with other jobs an
iteration that was preempted takes several times the others. :func:`summarize` says which
repeats are outliers (more than :data:`OUTLIER_SIGMAS` robust standard deviations and
:data:`OUTLIER_FRACTION` of the median above it) and how much the repeats spread
(1.4826 x the median absolute deviation over the median: a coefficient of variation that a few
outliers do not move); :func:`profile_noise` combines the stages' into the profile's
``measured.noise`` (docs/profiling.md, "Timing").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["OUTLIER_FRACTION", "OUTLIER_SIGMAS", "Summary", "profile_noise", "summarize"]

MAD_TO_SIGMA = 1.4826
"""The median absolute deviation of normal samples times this is their standard deviation."""
OUTLIER_SIGMAS = 3.0
OUTLIER_FRACTION = 0.1
"""A repeat is an outlier when it is more than 3 robust standard deviations and 10% of the
median away from the median (the 10% keeps tiny, very regular stages from flagging jitter)."""


@dataclass(frozen=True)
class Summary:
    """The timed repeats of one stage.

    Attributes
    ----------
    median : float
        The median (the time reported).
    spread : float
        ``1.4826 * MAD / median`` (0 for one repeat or a zero median).
    outliers : int
        Repeats flagged as outliers.
    """

    median: float
    spread: float
    outliers: int


def summarize(samples: Sequence[float]) -> Summary:
    """The median, the robust relative spread and the outliers of ``samples``."""
    if not samples:
        return Summary(0.0, 0.0, 0)
    median = statistics.median(samples)
    if len(samples) < 2 or median <= 0:
        return Summary(median, 0.0, 0)
    sigma = MAD_TO_SIGMA * statistics.median(abs(s - median) for s in samples)
    limit = max(OUTLIER_SIGMAS * sigma, OUTLIER_FRACTION * median)
    outliers = sum(1 for s in samples if abs(s - median) > limit)
    return Summary(median, sigma / median, outliers)


def profile_noise(stages: Sequence[tuple[Summary, float]]) -> float:
    """The profile's spread: the stages' spreads weighted by ``weight`` (their share of the
    time: median times the number of stages the measurement stands for).
    """
    total = sum(weight for _, weight in stages)
    if total <= 0:
        return 0.0
    return sum(summary.spread * weight for summary, weight in stages) / total
