"""Field types shared by the profile models: bounded sizes and times, strict models."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MAX_BYTES = 2**50
"""The largest size a profile may state (1 PiB): sums over thousands of stages stay exact in int64."""
MAX_MS = 1e12
"""The longest time a profile may state (about 30 years, in ms)."""

Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
SignedBytes = Annotated[int, Field(ge=-MAX_BYTES, le=MAX_BYTES)]
"""A difference of sizes (a backward's peak beyond what it keeps, which can be below it)."""
Milliseconds = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]


class Strict(BaseModel):
    """Frozen, no unknown keys (free-form data goes under ``extra``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)
