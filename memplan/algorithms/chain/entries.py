"""The chain family (rematerialization): its options and algorithms, declared once.

Each algorithm's ``solve(profile, request)`` runs its solver (which returns a ``ChainPlan``) on the
chain for the activation budget and wraps the plan with
:func:`memplan.algorithms.timeline.chain_schedule`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from memplan.algorithms.base import AlgorithmInfo, Family, SolveRequest
from memplan.algorithms.chain.periodic import solve_periodic as plan_periodic
from memplan.algorithms.chain.problem import Chain
from memplan.algorithms.chain.revolve import solve_revolve as plan_revolve
from memplan.algorithms.chain.rotor import chain_min_memory
from memplan.algorithms.chain.rotor import solve_rotor as plan_rotor
from memplan.algorithms.chain.store_all import solve_store_all as plan_store_all
from memplan.algorithms.options import slots_option
from memplan.algorithms.timeline import chain_schedule
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


def solve_store_all(profile: Profile, request: SolveRequest) -> Schedule:
    """``store-all``: every forward saves everything (:mod:`.store_all`)."""
    started = time.perf_counter()
    plan = plan_store_all(Chain.from_profile(profile), request.activation_memory)
    return chain_schedule(profile, request, "store-all", plan, started)


def solve_periodic(profile: Profile, request: SolveRequest) -> Schedule:
    """``periodic``: equal segments (:mod:`.periodic`)."""
    started = time.perf_counter()
    plan = plan_periodic(Chain.from_profile(profile), request.activation_memory)
    return chain_schedule(profile, request, "periodic", plan, started)


def solve_revolve(profile: Profile, request: SolveRequest) -> Schedule:
    """``revolve``: binomial checkpointing (:mod:`.revolve`)."""
    started = time.perf_counter()
    plan = plan_revolve(Chain.from_profile(profile), request.activation_memory)
    return chain_schedule(profile, request, "revolve", plan, started)


def solve_rotor(profile: Profile, request: SolveRequest) -> Schedule:
    """``rotor``: the DP for heterogeneous chains, in bytes or ``request.options.slots`` (:mod:`.rotor`)."""
    started = time.perf_counter()
    chain = Chain.from_profile(profile)
    plan = plan_rotor(chain, request.activation_memory, slots=request.options.slots)
    return chain_schedule(profile, request, "rotor", plan, started)


def describe_chain(profile: Profile, static_memory: int) -> dict[str, Any]:
    """What ``memplan info`` shows for a chain: store-all need, least memory, the stage table."""
    chain = Chain.from_profile(profile)
    return {
        "input_size": profile.input_size,
        "store_all_memory": static_memory + chain.store_all_peak(),
        "min_memory": {"chain": static_memory + chain_min_memory(chain)},
        "stage_table": [s.model_dump(exclude_none=True) for s in profile.stages],
    }


FAMILY = Family(
    name="chain",
    profile_kind="chain",
    options=ChainOptions,
    describe=describe_chain,
    algorithms=(
        AlgorithmInfo(
            name="store-all",
            family="chain",
            exact=True,
            needs="profile",
            summary="no recomputation: fastest, needs the most memory (tells how much)",
            short="no recomputation: fastest, most memory",
            reference="-",
            solve=solve_store_all,
        ),
        AlgorithmInfo(
            name="periodic",
            family="chain",
            exact=False,
            needs="profile",
            summary="equal segments as torch checkpoint_sequential; fastest segment count that fits",
            short="equal segments (checkpoint_sequential)",
            reference="Chen et al. 2016, Training deep nets with sublinear memory cost",
            solve=solve_periodic,
        ),
        AlgorithmInfo(
            name="revolve",
            family="chain",
            exact=False,
            needs="profile",
            summary="binomial checkpointing, optimal for homogeneous chains (unit steps)",
            short="binomial checkpointing (homogeneous)",
            reference="Griewank & Walther 2000, Algorithm 799: Revolve",
            solve=solve_revolve,
        ),
        AlgorithmInfo(
            name="rotor",
            family="chain",
            exact=True,
            needs="profile, --slots",
            summary="optimal DP for heterogeneous chains (exact in bytes, or on a --slots grid)",
            short="optimal DP for heterogeneous chains",
            reference="Beaumont et al. 2019, Optimal checkpointing for heterogeneous chains",
            solve=solve_rotor,
        ),
    ),
)
