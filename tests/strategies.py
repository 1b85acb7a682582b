"""Hypothesis strategies shared by the property tests of every family."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from memplan.profile.model import Profile, Stage


@st.composite
def chains(
    draw: st.DrawFn, *, min_size: int = 1, max_size: int = 20, max_extra: int = 20
) -> Profile:
    """Chains of 1 to 8 stages: sizes ``min_size..max_size`` bytes (saved: output plus up to
    ``max_extra``), overheads and weights 0..10 bytes, times 0..10 ms (integers or 3 decimals)."""
    length = draw(st.integers(1, 8))
    sizes = st.integers(min_size, max_size)
    small = st.integers(0, 10)
    times = st.one_of(
        st.integers(0, 10).map(float), st.floats(0.1, 10.0).map(lambda t: round(t, 3))
    )
    stages = []
    for k in range(length):
        out = draw(sizes)
        stages.append(
            Stage(
                name=f"s{k}",
                forward_time=draw(times),
                backward_time=draw(times),
                output_size=out,
                saved_size=out + draw(st.integers(0, max_extra)),
                forward_overhead=draw(small),
                backward_overhead=draw(small),
                weight_size=draw(small),
                grad_size=draw(st.none() | sizes),
            )
        )
    return Profile(model=f"hypothesis-{length}", input_size=draw(sizes), stages=stages)


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


def with_loop_terms(profile: Profile, seed: int) -> Profile:
    """``profile`` with the fields of a measured profile drawn at random (``weight_size``,
    ``weight_grad_size``, ``backward_overhead_fresh``, ``forward_overhead_all``, ``input_saved``,
    ``output_saved``): about half the stages free their input after ``F_all`` (docs/model.md,
    "The training loop")."""
    rng = random.Random(seed)
    stages = []
    for stage in profile.stages:
        weights = rng.randint(0, 6)
        stages.append(
            stage.model_copy(
                update={
                    "weight_size": weights,
                    "weight_grad_size": rng.randint(0, weights),
                    "backward_overhead_fresh": rng.randint(-stage.saved_size, 4),
                    "forward_overhead_all": rng.randint(0, stage.forward_overhead + 2),
                    "input_saved": rng.random() < 0.4,
                    "output_saved": rng.random() < 0.3,
                }
            )
        )
    return profile.model_copy(update={"stages": stages})
