"""Hypothesis strategies shared by the property tests of every family."""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st

from memplan.profile.model import Profile, Stage

FULL_EXAMPLES = 100  # hypothesis's own default: the profiles of `make test-all` (tests/conftest.py)


def examples(n: int) -> int:
    """``max_examples`` for a property test that wants ``n`` examples in a full run: ``n`` under
    the full profiles (``make test-all``), scaled down with the loaded profile's
    ``max_examples`` otherwise (``make test``: about a third, at least 10)."""
    return min(n, max(10, n * settings.default.max_examples // FULL_EXAMPLES))


@st.composite
def chains(
    draw: st.DrawFn, *, min_size: int = 1, max_size: int = 20, max_extra: int = 20
) -> Profile:
    """Chains of 1 to 8 stages: sizes ``min_size..max_size`` bytes (saved: output plus up to
    ``max_extra``), overheads and weights 0..10 bytes, times 0..10 ms (integers or 3 decimals)."""
    length = draw(st.integers(1, 8))
    sizes = st.integers(min_size, max_size)
    times = st.one_of(
        st.integers(0, 10).map(float), st.floats(0.1, 10.0).map(lambda t: round(t, 3))
    )
    stages = _stages(draw, length, times, sizes, st.integers(0, max_extra), st.integers(0, 10))
    return Profile(model=f"hypothesis-{length}", input_size=draw(sizes), stages=stages)


def _stages(
    draw: st.DrawFn,
    length: int,
    times: st.SearchStrategy[float],
    sizes: st.SearchStrategy[int],
    extra: st.SearchStrategy[int],
    small: st.SearchStrategy[int],
) -> list[Stage]:
    """``length`` stages: times from ``times``, outputs and gradients (or none) from ``sizes``,
    saved = output + ``extra``, overheads and weights from ``small``."""
    stages = []
    for k in range(length):
        out = draw(sizes)
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=draw(times),
                backward_time=draw(times),
                output_size=out,
                saved_size=out + draw(extra),
                forward_overhead=draw(small),
                backward_overhead=draw(small),
                weight_size=draw(small),
                grad_size=draw(st.none() | sizes),
            )
        )
    return stages


def integer_chain(
    seed: int, length: int, *, max_output: int, max_extra: int, max_input: int, model: str
) -> Profile:
    """A small chain with integer times (forward 1..4 ms, backward 1..6 ms) and sizes (outputs
    ``1..max_output``, saved = output + ``0..max_extra``, input ``1..max_input``), overheads 0..1,
    drawn from ``random.Random(seed)``: the same seed always gives the same chain."""
    rng = random.Random(seed)
    stages = []
    for k in range(length):
        out = rng.randint(1, max_output)
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=float(rng.randint(1, 4)),
                backward_time=float(rng.randint(1, 6)),
                output_size=out,
                saved_size=out + rng.randint(0, max_extra),
                forward_overhead=rng.randint(0, 1),
                backward_overhead=rng.randint(0, 1),
            )
        )
    return Profile(model=model, input_size=rng.randint(1, max_input), stages=stages)


EXTREME_TIMES = (0.0, 5e-324, 1e-300, 1.3698781973088174e-272, 1e-42, 1e-6, 1.0, 1000.0, 1e6, 1e12)
"""Times (ms) at the edges of what a profile holds: zero, the least denormal, tiny normals, up to
:data:`memplan.profile.model.MAX_MS`."""
EXTREME_SIZES = (0, 1, 2, 1000, 2**20, 2**30, 2**40, 2**40 + 1276)
"""Sizes (bytes) from nothing to a terabyte (and a terabyte and a few bytes)."""


@st.composite
def extreme_chains(draw: st.DrawFn, *, max_length: int = 6) -> Profile:
    """Chains of 1 to ``max_length`` stages whose times and sizes mix the extremes of
    :data:`EXTREME_TIMES` and :data:`EXTREME_SIZES` with ordinary values (times 0..1000 ms,
    sizes 0..2**20 bytes), as a tester's fuzzer draws them."""
    length = draw(st.integers(1, max_length))
    times = st.one_of(st.sampled_from(EXTREME_TIMES), st.floats(0.0, 1000.0))
    sizes = st.one_of(st.sampled_from(EXTREME_SIZES), st.integers(0, 2**20))
    small = st.one_of(st.sampled_from((0, 1, 2**30, 2**40)), st.integers(0, 1000))
    stages = _stages(draw, length, times, sizes, small, small)
    return Profile(model=f"extreme-{length}", input_size=draw(sizes), stages=stages)


def extreme_bandwidths() -> st.SearchStrategy[float]:
    """Bandwidths (bytes/s) from 1e3 to 1e14: the ends, and log-uniform values between."""
    return st.one_of(
        st.sampled_from((1e3, 1e9, 1e13, 1e14)),
        st.floats(3.0, 14.0).map(lambda e: float(10**e)),
    )


def with_options(profile: Profile, seed: int, most: int = 2) -> Profile:
    """``profile`` with up to ``most`` random options per stage (docs/model.md, "Options of a
    stage"): each saves less than the stage (never less than its output), needs up to 6 more
    bytes in its backward and takes 0..5 ms longer (whole ms: exact sums). Its forward overhead is
    the stage's, so that a brute force over stages rewritten to one option each sees the same
    recomputations (the ``F_ck``/``F_n`` of a stage keep the stage's own overhead)."""
    rng = random.Random(seed)
    stages = []
    for st_ in profile.stages:
        options = []
        for _ in range(rng.randint(0, most)):
            saved = rng.randint(st_.output_size, st_.saved_size)
            options.append(
                {
                    "name": f"policy{len(options) + 1}",
                    "saved_size": saved,
                    "forward_overhead": st_.forward_overhead,
                    "backward_overhead": st_.backward_overhead + rng.randint(0, 6),
                    "backward_time": st_.backward_time + rng.randint(0, 5),
                }
            )
        stage = st_.model_dump(exclude_none=True)
        if options:
            stage["options"] = options
        stages.append(stage)
    data = profile.model_dump(exclude_none=True)
    data["stages"] = stages
    return Profile.model_validate(data)


LOOP_CASES = (
    ("at-backward", "sgd"),
    ("kept", "sgd"),
    ("at-backward", "adamw:foreach"),
    ("kept", "adam:for-loop"),
    ("step-in-backward", "adam:for-loop"),
)
"""``(gradients, optimizer)``: every training loop, with the optimizer's step after the backward
(foreach, for-loop) and in it (docs/model.md), for the families' loop-term tests."""


def with_loop_terms(profile: Profile, seed: int) -> Profile:
    """``profile`` with the fields of a measured profile drawn at random (``weight_size``,
    ``weight_grad_size``, ``backward_overhead_fresh``, ``forward_overhead_all``, ``input_saved``,
    ``output_saved``): about half the stages free their input after ``F_all`` (docs/model.md,
    "The training loop")."""
    rng = random.Random(seed)
    return profile.model_copy(
        update={"stages": _first_uses([_measured(rng, st) for st in profile.stages], seed)}
    )


def join_with_loop_terms(profile: Profile, seed: int) -> Profile:
    """A join ``profile`` with the fields of a measured profile drawn at random on every branch
    stage and on the turn, as :func:`with_loop_terms`."""
    rng = random.Random(seed)
    assert profile.branches is not None and profile.turn is not None
    branches = [
        b.model_copy(
            update={"stages": _first_uses([_measured(rng, st) for st in b.stages], seed + j)}
        )
        for j, b in enumerate(profile.branches)
    ]
    turn = _first_uses([_measured(rng, profile.turn)], seed)[0]
    return profile.model_copy(update={"branches": branches, "turn": turn})


def _measured(rng: random.Random, stage: Stage) -> Stage:
    weights = rng.randint(0, 6)
    return stage.model_copy(
        update={
            "weight_size": weights,
            "weight_grad_size": rng.randint(0, weights),
            "backward_overhead_fresh": rng.randint(-stage.saved_size, 4),
            "forward_overhead_all": rng.randint(0, stage.forward_overhead + 2),
            "input_saved": rng.random() < 0.4,
            "output_saved": rng.random() < 0.3,
        }
    )


def _first_uses(stages: list[Stage], seed: int) -> list[Stage]:
    """``first_use_grad_size`` and ``largest_grad_size`` drawn consistently with
    ``weight_grad_size``: some of the gradients stage ``k`` creates belong to parameters an earlier
    stage uses first (shared, as a tied embedding), whose step comes at that stage's backward."""
    rng = random.Random(seed + 7919)
    first = [0] * len(stages)
    for k, stage in enumerate(stages):
        created = stage.weight_grad_size or 0
        shared = rng.randint(0, created) if k > 0 and rng.random() < 0.3 else 0
        first[k] += created - shared
        first[rng.randrange(k) if shared else k] += shared
    return [
        stage.model_copy(
            update={
                "first_use_grad_size": first[k],
                "largest_grad_size": rng.randint(min(1, first[k]), first[k]),
            }
        )
        for k, stage in enumerate(stages)
    ]
