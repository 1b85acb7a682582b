"""Operator-level training graphs (papers/002, OLLA): reordering and address assignment."""

from __future__ import annotations

from typing import Any


def describe_graph(profile: Any, static_memory: int) -> dict[str, Any]:
    """What ``memplan info`` adds for a graph profile (min_memory per family, ...): to be filled."""
    return {"min_memory": {}}
