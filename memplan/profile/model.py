"""The ``memplan-profile/1`` data model (see docs/formats.md and the SPEC).

A profile holds one of three network shapes, and says which algorithm families can serve it
(:attr:`Profile.families`):

- a *chain* (``stages``, forward order, the last stage being the loss): the chain, offload,
  combined and pipeline families;
- a *join network* (``branches``, each a chain with its own input, and the ``turn`` stage that
  joins them, *Optimal Memory-aware Backpropagation of Deep Join Networks*): the join family;
- an operator-level *training graph* (``graph``, the OLLA paper): the graph family. A graph may come
  alongside ``stages`` (``memplan profile --graph`` writes a graph-only profile).

The pydantic models below hold every check (strict types, non-negative sizes and times, no unknown
keys except under ``extra``): algorithms trust a validated :class:`Profile`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any, Final, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from memplan.profile.fields import MAX_BYTES, MAX_MS, Bytes, Milliseconds, SignedBytes
from memplan.profile.fields import Strict as _Strict
from memplan.profile.graph import Graph
from memplan.units import MAX_RATE, MIN_RATE

__all__ = [
    "MAX_BYTES",
    "MAX_MS",
    "Branch",
    "Conditions",
    "Device",
    "Graph",
    "Measured",
    "Noise",
    "Profile",
    "Stage",
    "StageOption",
]

PROFILE_FORMAT: Final = "memplan-profile/1"


class StageOption(_Strict):
    """One more way to run a stage's ``F_all``: a selective checkpointing policy.

    It keeps only some of the block's tensors and recomputes the others in its backward
    (docs/model.md, "Options of a stage"). Its fields replace the stage's own under that option.
    """

    name: str = Field(description="the policy (memplan.torch.runtime.selective): save-matmuls, ...")
    saved_size: Bytes = Field(description="bytes kept for the backward under the policy")
    forward_overhead: Bytes = 0
    backward_overhead: Bytes = Field(
        default=0, description="temporary bytes of the backward, the recomputed tensors included"
    )
    backward_time: Milliseconds = Field(description="ms, the recomputation included")


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
    weight_grad_size: Bytes | None = Field(
        default=None,
        description="bytes of the parameter gradients this stage's backward creates when they "
        "are None before it (zero_grad(set_to_none=True)); unknown when omitted",
    )
    backward_overhead_fresh: SignedBytes | None = Field(
        default=None,
        description="the peak of that backward beyond the input gradient and the "
        "weight_grad_size bytes it creates; negative when the backward frees what the forward "
        "saved before it has created them all; unknown when omitted",
    )
    forward_overhead_all: Bytes | None = Field(
        default=None,
        description="temporary bytes of the forward with autograd (F_all) beyond saved_size "
        "(forward_overhead is the larger of it and the F_ck/F_n one); unknown when omitted",
    )
    first_use_grad_size: Bytes | None = Field(
        default=None,
        description="bytes of the gradients of the parameters this stage uses first (forward "
        "order): complete at the end of its backward, where the optimizer step in the backward "
        "steps and frees them; weight_grad_size when omitted",
    )
    largest_grad_size: Bytes | None = Field(
        default=None,
        description="the largest of those gradients: the temporaries of a for-loop optimizer "
        "step are multiples of it; first_use_grad_size when omitted",
    )
    input_saved: bool | None = Field(
        default=None, description="whether the backward keeps the stage's input x_k"
    )
    output_saved: bool | None = Field(
        default=None, description="whether the backward keeps the stage's output x_{k+1}"
    )
    options: list[StageOption] | None = Field(
        default=None,
        description="more ways to run F_all (option 1, 2, ...); option 0 is the stage's own "
        "saved_size, overheads and backward_time",
    )
    extra: dict[str, Any] | None = None

    @property
    def gradient_size(self) -> int:
        """Bytes of the gradient of the output: ``grad_size``, else ``output_size``."""
        return self.output_size if self.grad_size is None else self.grad_size

    @model_validator(mode="after")
    def _saved_holds_output(self) -> Stage:
        if self.saved_size < self.output_size:
            raise ValueError(
                f"saved_size ({self.saved_size}) must include the output "
                f"(output_size {self.output_size})"
            )
        for i, option in enumerate(self.options or ()):
            if option.saved_size < self.output_size:
                raise ValueError(
                    f"options[{i}].saved_size ({option.saved_size}) must include the output "
                    f"(output_size {self.output_size})"
                )
        return self

    def option(self, index: int) -> StageOption:
        """Option ``index`` of the stage's ``F_all`` (0: the stage's own fields)."""
        if index == 0:
            return StageOption(
                name="save-all",
                saved_size=self.saved_size,
                forward_overhead=self.forward_overhead,
                backward_overhead=self.backward_overhead,
                backward_time=self.backward_time,
            )
        return (self.options or [])[index - 1]

    @property
    def option_count(self) -> int:
        """How many ways to run ``F_all``: 1 + ``len(options)``."""
        return 1 + len(self.options or ())


class Device(_Strict):
    """Where a profile was measured (``cpu``, ``cuda``) or for which GPU it was estimated."""

    kind: Literal["cpu", "cuda", "estimated", "synthetic"]
    name: str | None = None
    memory: Bytes | None = None


class Conditions(_Strict):
    """What a measured profile's sizes and times depend on besides the model and its input.

    See docs/profiling.md, "Conditions": ``memplan run`` and ``fit`` compare them with their own.
    """

    threads: PositiveInt | None = Field(
        default=None, description="torch's intra-op threads (torch.get_num_threads())"
    )
    cpu: str | None = Field(default=None, description="the CPU's model name")
    cpu_capability: str | None = Field(
        default=None, description="ATen's CPU kernels (torch.backends.cpu.get_cpu_capability())"
    )
    kernels: dict[str, str] | None = Field(
        default=None,
        description="environment variables that select kernels (DNNL_MAX_CPU_ISA...), when set",
    )
    mkldnn: bool | None = Field(default=None, description="torch.backends.mkldnn.enabled")
    torch: str | None = Field(default=None, description="torch.__version__")
    dtype: str | None = None
    device: str | None = Field(default=None, description="cpu, or cuda and the GPU's name")
    cuda: str | None = Field(default=None, description="torch.version.cuda and cuDNN's version")
    extra: dict[str, Any] | None = None


class Noise(_Strict):
    """How much the timed repeats of a measured profile varied (docs/profiling.md)."""

    spread: float = Field(
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="robust relative spread of the repeats (1.4826 x median absolute deviation "
        "over the median), stages weighted by their time",
    )
    outliers: NonNegativeInt = Field(
        default=0, description="timed repeats flagged as outliers (far above their stage's median)"
    )
    flagged: list[str] | None = Field(default=None, description="stages with outliers")


class Measured(_Strict):
    """How a profile was measured: the tool, torch's version, the date, repeats, conditions."""

    tool: str | None = None
    torch: str | None = None
    date: str | None = None
    repeats: NonNegativeInt | None = None
    conditions: Conditions | None = None
    noise: Noise | None = None
    extra: dict[str, Any] | None = None
    estimate: dict[str, Any] | None = Field(
        default=None,
        description="estimated profiles: the estimation model and its inputs "
        "(model, catalog, tf32, gpu); see docs/estimation.md",
    )

    @field_validator("date", mode="before")
    @classmethod
    def _date_as_text(cls, value: Any) -> Any:
        """An unquoted ``date: 2026-11-21T10:00:00Z`` is a YAML timestamp: keep it as ISO text."""
        if isinstance(value, datetime.datetime):
            text = value.isoformat()
            return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text
        if isinstance(value, datetime.date):
            return value.isoformat()
        return value


class Branch(_Strict):
    """One branch of a join network: a chain from its own input to the turn (*Optimal Memory-aware Backpropagation of Deep Join Networks*)."""

    name: str
    input_size: Bytes = Field(description="bytes of the branch input")
    stages: list[Stage] = Field(min_length=1, max_length=10_000)
    extra: dict[str, Any] | None = None


CHAIN_FAMILIES = ("chain", "offload", "combined", "pipeline")
"""The families that serve a chain profile (``stages``)."""


class Profile(_Strict):
    """A network profile. Sizes in bytes, times in milliseconds, bandwidth in bytes/s.

    Exactly one of ``stages`` (a chain) and ``branches`` + ``turn`` (a join network) is given,
    or neither when the profile holds only a ``graph``.
    """

    format: Literal["memplan-profile/1"] = PROFILE_FORMAT
    model: str
    batch_size: NonNegativeInt | None = None
    input_shape: list[NonNegativeInt] | None = None
    dtype: str | None = None
    device: Device | None = None
    bandwidth: float | None = Field(
        default=None, ge=MIN_RATE, le=MAX_RATE, allow_inf_nan=False, description="bytes/s"
    )
    measured: Measured | None = None
    workspace_size: Bytes | None = Field(
        default=None,
        description="bytes the device's math libraries keep once a training step has run (the "
        "cuBLAS workspaces of the forward's and the backward's threads): static memory",
    )
    input_size: Bytes | None = Field(default=None, description="bytes of x_0 (chain profiles)")
    parameter_sizes: list[Bytes] | None = Field(
        default=None,
        max_length=1_000_000,
        description="bytes of each trainable parameter's gradient, in the order the optimizer "
        "steps them (the model's parameter order; a 0 between two parameter groups): a "
        "for-loop step's temporaries are those of consecutive parameters (docs/model.md)",
    )
    unreached_weight_size: Bytes | None = Field(
        default=None,
        description="bytes of the model's parameters and buffers that belong to no stage (a "
        "vision or audio tower a text batch never reaches): in memory for the whole step, "
        "without gradients or optimizer state (docs/model.md); 0 when omitted",
    )
    side_gradient_size: Bytes | None = Field(
        default=None,
        description="bytes of the tensors computed from parameters that the blocks read besides "
        "their hidden state (a learned position bias computed before them, a state a block "
        "makes for the next): autograd sums their gradients from every reader's backward; "
        "counted three times for the whole step (the tensor, the sum and one reader's share; "
        "the blocks' weight_size leaves it out, docs/model.md); 0 when omitted",
    )
    stages: list[Stage] | None = Field(default=None, min_length=1, max_length=10_000)
    branches: list[Branch] | None = Field(default=None, min_length=1, max_length=1_000)
    turn: Stage | None = Field(default=None, description="join networks: the stage joining them")
    graph: Graph | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> Profile:
        if self.stages is not None and (self.branches is not None or self.turn is not None):
            raise ValueError("a profile has either 'stages' (a chain) or 'branches' and 'turn'")
        if (self.branches is None) != (self.turn is None):
            missing = "turn" if self.turn is None else "branches"
            raise ValueError(f"a join network needs both 'branches' and 'turn' ({missing} missing)")
        if self.stages is None and self.branches is None and self.graph is None:
            raise ValueError("expected 'stages' (a chain), 'branches' and 'turn', or 'graph'")
        if self.stages is not None and self.input_size is None:
            raise ValueError("input_size: missing required field (bytes of the chain input x_0)")
        return self

    @property
    def kind(self) -> str:
        """``chain``, ``join`` or ``graph``: the shape of the network the profile holds."""
        if self.stages is not None:
            return "chain"
        return "join" if self.branches is not None else "graph"

    @property
    def families(self) -> tuple[str, ...]:
        """The algorithm families that can serve this profile."""
        found: tuple[str, ...] = ()
        if self.stages is not None:
            found += CHAIN_FAMILIES
        if self.branches is not None:
            found += ("join",)
        if self.graph is not None:
            found += ("graph",)
        return found

    @property
    def chain_stages(self) -> list[Stage]:
        """The stages of a chain profile (``stages``, known to be present).

        Raises
        ------
        ValueError
            The profile is a join network or a graph (the algorithms check the family first).
        """
        if self.stages is None:
            raise ValueError(f"{self.model}: a {self.kind} profile has no chain of stages")
        return self.stages

    def all_stages(self) -> list[Stage]:
        """Every stage: the chain's, or each branch's then the turn (join networks)."""
        if self.stages is not None:
            return list(self.stages)
        if self.branches is not None and self.turn is not None:
            return [st for branch in self.branches for st in branch.stages] + [self.turn]
        return []

    @property
    def length(self) -> int:
        """Stages of the chain (or of all branches plus the turn); graph nodes for a graph."""
        if self.stages is None and self.branches is None and self.graph is not None:
            return len(self.graph.nodes)
        return len(self.all_stages())

    @property
    def weight_size(self) -> int:
        """Bytes of the weights: the stages' (or the graph's)."""
        if self.stages is None and self.branches is None and self.graph is not None:
            return self.graph.weight_size
        return sum(stage.weight_size for stage in self.all_stages())

    @property
    def lower_bound(self) -> float:
        """Time of one iteration without any recomputation: every forward and backward once."""
        if self.stages is None and self.branches is None and self.graph is not None:
            return self.graph.compute_time
        return sum(s.forward_time + s.backward_time for s in self.all_stages())

    def to_dict(self) -> dict[str, Any]:
        """The profile as a JSON-ready document (unset fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)

    def sha256(self) -> str:
        """A digest of the content (canonical JSON), so that a schedule names its profile."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def activation_sizes(self) -> list[int]:
        """Sizes of x_0 .. x_L (x_0 is the chain input); chain profiles only."""
        assert self.stages is not None and self.input_size is not None, "a chain profile"
        return [self.input_size] + [s.output_size for s in self.stages]
