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


def homogeneous_join(
    lengths: list[int] | tuple[int, ...],
    *,
    size: int = 1,
    uf: float = 1.0,
    ub: float = 1.0,
    ut: float = 1.0,
    model: str | None = None,
) -> Profile:
    """A uniform join network (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A 2020): branches of ``lengths`` unit stages and a turn.

    Every branch input, activation, saved tensor and gradient has ``size`` bytes, every forward
    step costs ``uf``, every backward ``ub`` and the turn ``ut`` (its forward time; its backward
    time is 0): the setting of the paper, where ``--mem c*size --optimizer none`` is ``c`` slots.
    """
    from memplan.profile.model import Branch

    branches = [
        Branch(
            name=f"branch{j}",
            input_size=size,
            stages=[
                Stage(
                    name=f"b{j}s{i}",
                    forward_time=uf,
                    backward_time=ub,
                    output_size=size,
                    saved_size=size,
                )
                for i in range(length)
            ],
        )
        for j, length in enumerate(lengths)
    ]
    turn = Stage(name="turn", forward_time=ut, backward_time=0.0, output_size=size, saved_size=size)
    name = model or "join-" + "-".join(str(length) for length in lengths)
    return Profile(model=name, device=Device(kind="synthetic"), branches=branches, turn=turn)


def random_join(
    lengths: list[int] | tuple[int, ...],
    *,
    seed: int = 0,
    max_size: int = 10,
    max_time: float = 10.0,
    overheads: bool = True,
) -> Profile:
    """A heterogeneous join network: random branches as :func:`random_chain` and a random turn."""
    from memplan.profile.model import Branch

    rng = np.random.default_rng(seed)
    branches = []
    for j, length in enumerate(lengths):
        chain = random_chain(
            length,
            seed=int(rng.integers(0, 2**31)),
            max_size=max_size,
            max_time=max_time,
            overheads=overheads,
            integer_times=True,
        )
        branches.append(Branch(name=f"branch{j}", input_size=chain.input_size, stages=chain.stages))
    out = int(rng.integers(1, max_size + 1))
    turn = Stage(
        name="turn",
        forward_time=float(rng.integers(1, int(max_time) + 1)),
        backward_time=float(rng.integers(1, int(max_time) + 1)),
        output_size=1,
        saved_size=out,
    )
    return Profile(
        model=f"random-join-{'-'.join(map(str, lengths))}-seed{seed}",
        device=Device(kind="synthetic"),
        branches=branches,
        turn=turn,
    )
