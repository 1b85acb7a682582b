"""Synthetic chain profiles for tests, benchmarks and examples (``device.kind: synthetic``)."""

from __future__ import annotations

import numpy as np

from memplan.profile.model import Device, Profile, Stage


def homogeneous_chain(length: int, *, size: int = 1, time: float = 1.0) -> Profile:
    """``length`` identical stages: unit sizes (``size`` bytes) and unit times, no overheads.

    Every activation, saved tensor and gradient has ``size`` bytes, the setting of Revolve.
    """
    stages = [
        Stage(
            name=f"step{k}",
            forward_time=time,
            backward_time=time,
            output_size=size,
            saved_size=size,
        )
        for k in range(length)
    ]
    return Profile(
        model=f"homogeneous-{length}",
        device=Device(kind="synthetic"),
        input_size=size,
        stages=stages,
    )


def random_chain(
    length: int,
    *,
    seed: int = 0,
    max_size: int = 10,
    max_time: float = 10.0,
    overheads: bool = True,
    integer_times: bool = False,
) -> Profile:
    """A heterogeneous chain with random sizes (bytes in ``[1, max_size]``) and times.

    Saved sizes are output plus a random extra; overheads are drawn when ``overheads``.
    ``integer_times`` draws whole-millisecond times (exact sums, handy for exact comparisons).
    """
    rng = np.random.default_rng(seed)
    stages = []
    for k in range(length):
        out = int(rng.integers(1, max_size + 1))
        if integer_times:
            ft, bt = (
                float(rng.integers(1, int(max_time) + 1)),
                float(rng.integers(1, int(max_time) + 1)),
            )
        else:
            ft, bt = float(rng.uniform(0.1, max_time)), float(rng.uniform(0.1, max_time))
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=round(ft, 3),
                backward_time=round(bt, 3),
                output_size=out,
                saved_size=out + int(rng.integers(0, max_size + 1)),
                forward_overhead=int(rng.integers(0, max_size // 2 + 1)) if overheads else 0,
                backward_overhead=int(rng.integers(0, max_size // 2 + 1)) if overheads else 0,
                weight_size=int(rng.integers(0, max_size + 1)),
            )
        )
    return Profile(
        model=f"random-{length}-seed{seed}",
        device=Device(kind="synthetic"),
        input_size=int(rng.integers(1, max_size + 1)),
        stages=stages,
    )
