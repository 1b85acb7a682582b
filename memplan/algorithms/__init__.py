"""Every family and algorithm, behind one registry used by :func:`memplan.solve`.

A family is declared once in its package's ``entries`` module (a :class:`Family`: its
algorithms, each ``solve(profile, request) -> Schedule``, and its options); this module only
collects them, and lists them (:func:`list_algorithms`, :func:`algorithm_details`: what ``memplan
algos`` prints, read without importing a solver). The simulator that replays each family's schedules is
:data:`memplan.simulator.replay.REPLAYS`. See docs/algorithms.md, "How to add an algorithm".
"""

from __future__ import annotations

from typing import Any

from memplan.algorithms.base import (
    PROFILE_SHAPES,
    AlgorithmInfo,
    ChainPlan,
    Family,
    OffloadPlan,
    SolveRequest,
)
from memplan.algorithms.chain.entries import FAMILY as CHAIN
from memplan.algorithms.combined.entries import FAMILY as COMBINED
from memplan.algorithms.graph.entries import FAMILY as GRAPH
from memplan.algorithms.join.entries import FAMILY as JOIN
from memplan.algorithms.offload.entries import FAMILY as OFFLOAD
from memplan.algorithms.options import Option, declared, parse_options
from memplan.algorithms.pipeline.entries import FAMILY as PIPELINE
from memplan.errors import InputError, did_you_mean

FAMILIES: dict[str, Family] = {
    family.name: family for family in (CHAIN, OFFLOAD, COMBINED, JOIN, GRAPH, PIPELINE)
}
"""Every family by name, in the order ``memplan algos`` lists them."""

REGISTRY: dict[str, AlgorithmInfo] = {
    info.name: info for family in FAMILIES.values() for info in family.algorithms
}
"""Every algorithm by name."""


def algorithm(name: str) -> AlgorithmInfo:
    """The algorithm called ``name``; an unknown name is an InputError listing the valid ones."""
    if name not in REGISTRY:
        raise InputError(
            f"unknown algorithm {name!r}{did_you_mean(name, REGISTRY)}; "
            f"choose one of: {', '.join(REGISTRY)}"
        )
    return REGISTRY[name]


def list_algorithms() -> list[dict[str, Any]]:
    """Every algorithm memplan knows: name, family, exact or heuristic, what it needs."""
    return [info.to_dict() for info in REGISTRY.values()]


def algorithm_details(name: str) -> dict[str, Any]:
    """``memplan algos NAME``: the algorithm's entry and its family's declared options."""
    info = algorithm(name)
    family = FAMILIES[info.family]
    options = [
        {
            "option": spec.flag,
            "metavar": spec.metavar,
            "default": spec.default_text,
            "accepts": spec.accepts,
            "help": spec.help,
            "commands": list(spec.commands),
            "keyword": spec.name,
        }
        for spec in declared(family.options, family.name)
    ]
    return {**info.to_dict(), "profile": PROFILE_SHAPES[family.profile_kind], "options": options}


def family_of(name: str) -> Family:
    """The family of the algorithm called ``name`` (InputError when unknown)."""
    return FAMILIES[algorithm(name).family]


def all_options() -> list[Option]:
    """Every family's declared options, family by family, in declaration order."""
    return [spec for fam in FAMILIES.values() for spec in declared(fam.options, fam.name)]


def options_for(name: str, given: dict[str, Any]) -> Any:
    """The options object of algorithm ``name``'s family from the values a caller gave.

    None means "not given". Values of options only other families declare are checked and
    dropped; an option no family declares is a TypeError (see :func:`parse_options`).
    """
    fam = family_of(name)
    return parse_options(fam.name, fam.options, given, all_options())


def parsed_option(name: str, value: Any) -> Any:
    """``value`` checked and converted by the first family that declares option ``name``."""
    if value is None:
        return None
    for spec in all_options():
        if spec.name == name:
            return spec.parse(value)
    raise TypeError(f"no family declares the option {name!r}")


__all__ = [
    "FAMILIES",
    "REGISTRY",
    "AlgorithmInfo",
    "ChainPlan",
    "Family",
    "OffloadPlan",
    "SolveRequest",
    "algorithm",
    "algorithm_details",
    "all_options",
    "family_of",
    "list_algorithms",
    "options_for",
    "parsed_option",
]
