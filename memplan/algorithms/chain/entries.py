"""The chain family (rematerialization): its options and algorithms, declared once.

Every family's entries follow one idiom (docs/algorithms.md, "How to add an algorithm"): one
adapter ``solve_<algorithm>(profile, request) -> Schedule`` per algorithm, which imports its
solver when first called (declaring the families loads no solver), runs it on the family's
problem for the activation budget and wraps the answer as a schedule; ``describe_<family>``
for ``memplan info``; the family's options; one :class:`Family` naming the family once.
Here each solver returns a ``ChainPlan``, wrapped by
:func:`memplan.algorithms.timeline.chain_schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memplan.algorithms.base import AlgorithmInfo, Family, SolveRequest
from memplan.algorithms.options import slots_option

if TYPE_CHECKING:  # annotations only: declaring the family loads no model
    from memplan.loop import TrainingLoop
    from memplan.profile.model import Profile
    from memplan.schedule import Schedule

MAX_SLOTS = 100_000


@dataclass(frozen=True)
class ChainOptions:
    """Options of the chain family."""

    slots: int | str = slots_option(
        "auto",
        MAX_SLOTS,
        words=("auto",),
        default_text="auto: exact in bytes when affordable, else the finest grid tightened in bytes",
    )


def _chain(profile: Profile, request: SolveRequest) -> Any:
    """The chain the request plans for: the profile's, under the training loop's terms of
    ``request.gradients`` (NOTE [ training-loop memory terms ], memplan/profile/memory.py).
    """
    from memplan.algorithms.chain.problem import ChainInstance

    return ChainInstance.from_profile(profile, request.loop)


def solve_store_all(profile: Profile, request: SolveRequest) -> Schedule:
    """``store-all``: every forward saves everything (:mod:`.store_all`)."""
    from memplan.algorithms.chain import store_all
    from memplan.algorithms.timeline import chain_schedule

    plan = store_all.solve_store_all(_chain(profile, request), request.activation_memory)
    return chain_schedule(profile, request, plan)


def solve_periodic(profile: Profile, request: SolveRequest) -> Schedule:
    """``periodic``: equal segments (:mod:`.periodic`)."""
    from memplan.algorithms.chain import periodic
    from memplan.algorithms.timeline import chain_schedule

    plan = periodic.solve_periodic(_chain(profile, request), request.activation_memory)
    return chain_schedule(profile, request, plan)


def solve_revolve(profile: Profile, request: SolveRequest) -> Schedule:
    """``revolve``: binomial checkpointing (:mod:`.revolve`)."""
    from memplan.algorithms.chain import revolve
    from memplan.algorithms.timeline import chain_schedule

    plan = revolve.solve_revolve(_chain(profile, request), request.activation_memory)
    return chain_schedule(profile, request, plan)


def solve_rotor(profile: Profile, request: SolveRequest) -> Schedule:
    """``rotor``: the DP for heterogeneous chains, in bytes or ``request.options.slots`` (:mod:`.rotor`)."""
    from memplan.algorithms.chain import rotor
    from memplan.algorithms.timeline import chain_schedule

    chain = _chain(profile, request)
    plan = rotor.plan_rotor(chain, request.activation_memory, slots=request.options.slots)
    return chain_schedule(profile, request, plan)


def describe_chain(profile: Profile, static_memory: int, loop: TrainingLoop) -> dict[str, Any]:
    """What ``memplan info`` shows for a chain: store-all need, least memory, the stage table,
    for the training loop ``loop`` (docs/model.md); the optimizer's step after the backward
    counts in both figures.
    """
    from memplan.algorithms.chain import rotor
    from memplan.algorithms.chain.problem import ChainInstance
    from memplan.algorithms.timeline import step_peak

    chain = ChainInstance.from_profile(profile, loop)
    step = step_peak(profile, loop, static_memory)
    return {
        "input_size": profile.input_size,
        "store_all_memory": max(static_memory + chain.store_all_peak(), step),
        "min_memory": {"chain": max(static_memory + rotor.chain_min_memory(chain), step)},
        "stage_table": [s.model_dump(exclude_none=True) for s in profile.chain_stages],
    }


FAMILY = Family(
    name="chain",
    profile_kind="chain",
    options=ChainOptions,
    describe=describe_chain,
    loop_terms=True,
    algorithms=(
        AlgorithmInfo(
            name="store-all",
            exact=True,
            needs="profile",
            summary="no recomputation: fastest, needs the most memory (tells how much)",
            short="no recomputation: fastest, most memory",
            reference="-",
            solve=solve_store_all,
        ),
        AlgorithmInfo(
            name="periodic",
            exact=False,
            needs="profile",
            summary="equal segments as torch checkpoint_sequential; fastest segment count that fits",
            short="equal segments (checkpoint_sequential)",
            reference="Chen et al. 2016, Training deep nets with sublinear memory cost",
            solve=solve_periodic,
        ),
        AlgorithmInfo(
            name="revolve",
            exact=False,
            needs="profile",
            summary="binomial checkpointing, optimal for homogeneous chains (unit steps)",
            short="binomial checkpointing (homogeneous)",
            reference="Griewank & Walther 2000, Algorithm 799: Revolve",
            solve=solve_revolve,
        ),
        AlgorithmInfo(
            name="rotor",
            exact=True,
            needs="profile, --slots",
            summary="optimal DP for heterogeneous chains (exact in bytes, or on a --slots grid)",
            short="optimal DP for heterogeneous chains",
            reference="Beaumont et al. 2019, Optimal checkpointing for heterogeneous chains",
            solve=solve_rotor,
        ),
    ),
)
