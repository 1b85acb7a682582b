"""The ``memplan-profile/1`` data model (see docs/formats.md and the SPEC).

A chain profile lists the stages of a network in forward order, the last one being the loss.
The pydantic models below hold every check (strict types, non-negative sizes and times, no unknown
keys except under ``extra``): algorithms trust a validated :class:`Profile`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator

PROFILE_FORMAT = "memplan-profile/1"

MAX_BYTES = 2**50
"""The largest size a profile may state (1 PiB): sums over thousands of stages stay exact in int64."""
MAX_MS = 1e12
"""The longest time a profile may state (about 30 years, in ms)."""

Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
Milliseconds = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class Stage(_Strict):
    """One stage of the chain: stage ``k`` reads activation x_k and writes x_{k+1}."""

    name: str
    forward_time: Milliseconds = Field(description="ms")
    backward_time: Milliseconds = Field(description="ms")
    output_size: Bytes = Field(description="bytes of x_{k+1}")
    saved_size: Bytes = Field(
        description="bytes kept by the forward for the backward (x-bar), output included, "
        "input excluded"
    )
    forward_overhead: Bytes = 0
    backward_overhead: Bytes = 0
    weight_size: Bytes = 0
    grad_size: Bytes | None = Field(
        default=None, description="bytes of the gradient of x_{k+1}; output_size when omitted"
    )
    extra: dict[str, Any] | None = None

    @property
    def gradient_size(self) -> int:
        return self.output_size if self.grad_size is None else self.grad_size

    @model_validator(mode="after")
    def _saved_holds_output(self) -> Stage:
        if self.saved_size < self.output_size:
            raise ValueError(
                f"saved_size ({self.saved_size}) must include the output "
                f"(output_size {self.output_size})"
            )
        return self


class Device(_Strict):
    kind: Literal["cpu", "cuda", "estimated", "synthetic"]
    name: str | None = None
    memory: Bytes | None = None


class Measured(_Strict):
    tool: str | None = None
    torch: str | None = None
    date: str | None = None
    repeats: NonNegativeInt | None = None
    extra: dict[str, Any] | None = None
    estimate: dict[str, Any] | None = Field(
        default=None,
        description="estimated profiles: the estimation model and its inputs "
        "(model, catalog, tf32, gpu); see docs/estimation.md",
    )


class Profile(_Strict):
    """A chain profile. Sizes in bytes, times in milliseconds, bandwidth in bytes/s."""

    format: Literal["memplan-profile/1"] = PROFILE_FORMAT
    model: str
    batch_size: NonNegativeInt | None = None
    input_shape: list[NonNegativeInt] | None = None
    dtype: str | None = None
    device: Device | None = None
    bandwidth: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    measured: Measured | None = None
    input_size: Bytes
    stages: list[Stage] = Field(min_length=1, max_length=10_000)
    extra: dict[str, Any] | None = None

    @property
    def length(self) -> int:
        return len(self.stages)

    @property
    def weight_size(self) -> int:
        return sum(stage.weight_size for stage in self.stages)

    @property
    def lower_bound(self) -> float:
        """Time of one iteration without any recomputation: every forward and backward once."""
        return sum(s.forward_time + s.backward_time for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def sha256(self) -> str:
        """A digest of the content (canonical JSON), so that a schedule names its profile."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def activation_sizes(self) -> list[int]:
        """Sizes of x_0 .. x_L (x_0 is the chain input)."""
        return [self.input_size] + [s.output_size for s in self.stages]
