"""The join family (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A 2020): its options and algorithms, declared once.

One adapter per algorithm, as in every family (:mod:`memplan.algorithms.chain.entries`); the
join solvers (:mod:`.solve`) return finished schedules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memplan.algorithms.base import AlgorithmInfo, Family, SolveRequest
from memplan.algorithms.options import slots_option, time_limit_option

if TYPE_CHECKING:  # annotations only: declaring the family loads no model
    from memplan.loop import TrainingLoop
    from memplan.profile.model import Profile
    from memplan.schedule import Schedule

REFERENCE = "Beaumont, Herrmann, Pallez & Shilova, Optimal memory-aware backpropagation of deep join networks"


DEFAULT_SLOTS = 500
MAX_SLOTS = 100_000


@dataclass(frozen=True)
class JoinOptions:
    """Options of the join family (``slots``: the chain model of non-uniform profiles)."""

    slots: int = slots_option(DEFAULT_SLOTS, MAX_SLOTS)
    time_limit: float | None = time_limit_option(None)


def solve_join(profile: Profile, request: SolveRequest) -> Schedule:
    """``join``: the optimal canonical schedule (:func:`.solve.run_join`)."""
    from memplan.algorithms.join import solve

    return solve.run_join(profile, request)


def solve_equiv_chain(profile: Profile, request: SolveRequest) -> Schedule:
    """``equiv-chain``: the paper's baseline (:func:`.solve.run_equiv_chain`)."""
    from memplan.algorithms.join import solve

    return solve.run_equiv_chain(profile, request)


def describe_join(profile: Profile, static_memory: int, loop: TrainingLoop) -> dict[str, Any]:
    """What ``memplan info`` adds for a join profile: least memory, store-all need, c_min, for
    the training loop ``loop`` (NOTE [ join loop terms ]; the optimizer's step after the backward
    counts in them).

    For a uniform profile (docs/join.md) ``c_min`` is Theorem 2's, in slots of ``slot_size``
    bytes, and the memory figures are the pebble model's (``c_min`` and ``sum(l) + k`` slots);
    otherwise they are the chain model's (the least memory of a canonical plan, exact in bytes,
    and the store-all peak).
    """
    from memplan.algorithms.join.hetero import JoinNet, min_memory_plan
    from memplan.algorithms.join.pebble import c_min
    from memplan.algorithms.join.solve import uniform
    from memplan.algorithms.timeline import step_peak

    step = step_peak(profile, loop, static_memory)
    assert profile.branches is not None and profile.turn is not None, "a join profile"
    branches, turn = profile.branches, profile.turn
    lengths = [len(b.stages) for b in branches]
    found: dict[str, Any] = {
        "min_memory": {},
        "branches": ", ".join(f"{b.name} ({len(b.stages)})" for b in branches),
        "branch_lengths": lengths,
        "input_size": sum(b.input_size for b in branches),
        "stage_table": [
            {**st.model_dump(exclude_none=True), "name": f"{b.name}/{st.name}"}
            for b in branches
            for st in b.stages
        ]
        + [{**turn.model_dump(exclude_none=True), "name": f"turn/{turn.name}"}],
    }
    u = uniform(profile, loop)
    if u is not None:
        least = c_min(u.lengths)
        found.update(
            join_model="pebble",
            c_min=least,
            slot_size=u.size,
            store_all_memory=max(static_memory + (sum(lengths) + len(lengths)) * u.size, step),
            min_memory={"join": max(static_memory + least * u.size, step)},
        )
        return found
    net = JoinNet.from_profile(profile, loop)
    least, _ = min_memory_plan(net)
    found.update(
        join_model="chain",
        store_all_memory=max(static_memory + net.peak(net.store_all()), step),
        min_memory={"join": max(static_memory + least, step)},
    )
    return found


FAMILY = Family(
    name="join",
    profile_kind="join",
    options=JoinOptions,
    describe=describe_join,
    loop_terms=True,
    algorithms=(
        AlgorithmInfo(
            name="join",
            exact=True,
            needs="join profile (branches + turn); --slots if not uniform; --time-limit",
            summary="optimal canonical schedule of k chains joined by the loss (Opt_join DP; "
            "exact in slots for uniform profiles, rotor segments otherwise)",
            short="optimal canonical schedule (Opt_join)",
            reference=REFERENCE + ", Theorem 3",
            solve=solve_join,
        ),
        AlgorithmInfo(
            name="equiv-chain",
            exact=False,
            needs="join profile (branches + turn); --slots if not uniform",
            summary="baseline: steps at equal distance from the turn grouped into one chain, "
            "solved by Revolve (uniform) or rotor",
            short="baseline: equal-distance steps, one chain",
            reference=REFERENCE + ", Section 4 (EQUIV-CHAIN)",
            solve=solve_equiv_chain,
        ),
    ),
)
