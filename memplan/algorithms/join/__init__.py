"""Join networks (papers/003): Siamese and cross-modal networks joined by a loss."""

from __future__ import annotations

from typing import Any


def describe_join(profile: Any, static_memory: int) -> dict[str, Any]:
    """What ``memplan info`` adds for a join profile (min_memory per family, ...): to be filled."""
    return {"min_memory": {}}
