"""The ``memplan-schedule/1`` result type every algorithm returns (see the SPEC).

Infeasibility is not an exception: it is a :class:`Schedule` with ``feasible = False`` (and,
when known, ``min_memory``, the least budget with which the algorithm finds a plan).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PrivateAttr,
    ValidationError,
    model_serializer,
    model_validator,
)

from memplan.documents.io import dump_yaml, read_document, validation_message
from memplan.errors import InputError, empty_input
from memplan.loop import (
    OPTIMIZER_FACTORS,
    Gradients,
    Optimizer,
    OptimizerName,
    StepKind,
    TrainingLoop,
)
from memplan.units import MAX_RATE, MAX_SIZE, MIN_RATE

__all__ = ["OPTIMIZER_FACTORS", "Budget", "Op", "OptimizerName", "Schedule", "load_schedule"]

DEFAULT_OPTIMIZER: Final[OptimizerName] = "sgd"
"""What a schedule without ``budget.optimizer`` is replayed with (the CLI's default)."""

SCHEDULE_FORMAT: Final = "memplan-schedule/1"
OpName = Literal["F_all", "F_ck", "F_n", "B", "offload", "prefetch", "turn"]
Status = Literal["optimal", "feasible", "infeasible", "unknown"]
Stream = Literal["compute", "transfer"]
Size = Annotated[int, Field(ge=0, le=MAX_SIZE)]
"""Bytes, 0 to 2^60 (the CLI's largest size)."""
Rate = Annotated[float, Field(ge=MIN_RATE, le=MAX_RATE, allow_inf_nan=False)]
"""Bytes/s, 0.001 to 1e15 (as ``--bandwidth``)."""
Finite = Annotated[float, Field(allow_inf_nan=False)]
MAX_SHIFT = 10**9
"""The largest ``shift`` of a pipeline pattern operation (mini-batches; numpy int64 stays exact)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Op(_Model):
    """One operation. ``stage`` is the 0-based index into the profile's ``stages``.

    Transfers (``offload``/``prefetch``, offloading family) name the tensor they move in
    ``tensor``: ``s[k]`` (what stage ``k`` saved for its backward; the default for stage ``k``) or
    ``x[0]`` (the chain input, stage 0). Compute operations have no ``tensor``; the field is left
    out of the documents when it is unset.
    """

    op: OpName
    stage: int = Field(ge=0)
    start: float = Field(allow_inf_nan=False)
    end: float = Field(allow_inf_nan=False)
    stream: Stream = "compute"
    tensor: str | None = None
    branch: int | None = Field(default=None, ge=0)
    option: int | None = Field(default=None, ge=1)
    """On an ``F_all``: the stage's option it runs under (its ``options[option - 1]``, selective
    checkpointing); unset: option 0, the stage's own sizes and times."""

    @model_serializer(mode="wrap")
    def _drop_unset_tensor(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("tensor", "branch", "option"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class ProfileRef(_Model):
    """The profile a schedule was made for: its model, content digest and number of stages."""

    model: str
    sha256: str
    stages: int | None = None


class Budget(_Model):
    """What the plan had to fit: memory (bytes), bandwidth (bytes/s), GPUs, the training loop.

    The loop is what the memory counts (docs/model.md): the optimizer, its step, the gradients,
    the caller's output.
    """

    memory: Size | None = None
    bandwidth: Rate | None = None
    gpus: int | None = Field(default=None, ge=1)
    optimizer: OptimizerName | None = None
    optimizer_step: StepKind | None = None
    """How the optimizer's step runs (``for-loop``, ``foreach``, ``fused``): its temporaries are
    counted at the end of the backward (NOTE [ optimizer step temporaries ], memplan/loop.py);
    None: not counted (schedules written before they were, graph and pipeline schedules)."""
    optimizer_copies_grads: bool | None = None
    """The step copies the gradients (coupled weight decay, Nesterov momentum)."""
    gradients: Gradients | None = None
    """The training loop a plan was made for (docs/model.md); None: the model before the loop's
    terms (schedules written before them, graph and pipeline schedules)."""
    output_held: bool | None = None
    """The caller holds the model's output from one step to the next (``out = model(**batch)``)."""
    output_bytes: Size | None = None
    """The bytes it holds of it, as seen in the loop (every tensor of the output it keeps); None:
    the loss stage's input ``x[L-1]``."""
    shards: int | None = Field(default=None, ge=1)
    """The FSDP2 ranks the plan is one of (``--shards``, docs/sharding.md): the profile was
    planned as one rank's; None (left out of the document): the whole model on one GPU."""

    @model_serializer(mode="wrap")
    def _drop_unset_loop(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        loop = ("optimizer_step", "optimizer_copies_grads", "gradients", "output_held")
        for key in (*loop, "output_bytes", "shards"):
            if data.get(key) is None or data.get(key) is False:
                data.pop(key, None)
        return data

    @property
    def loop(self) -> TrainingLoop:
        """The training loop the budget counts, as one typed value."""
        optimizer = Optimizer(
            self.optimizer or DEFAULT_OPTIMIZER,
            self.optimizer_step,
            bool(self.optimizer_copies_grads),
        )
        return TrainingLoop(optimizer, self.gradients, bool(self.output_held), self.output_bytes)

    @classmethod
    def of(cls, memory: int | None, loop: TrainingLoop, **more: Any) -> Budget:
        """The budget of a plan made for ``loop``."""
        optimizer = loop.optimizer
        return cls(
            memory=memory,
            optimizer=optimizer.name,
            optimizer_step=optimizer.step,
            optimizer_copies_grads=optimizer.copies_grads or None,
            gradients=loop.gradients,
            output_held=loop.output_held or None,
            output_bytes=loop.output_bytes if loop.output_held else None,
            **more,
        )


class SolverInfo(_Model):
    """How the solver ended: seconds, status, slots of a discretized DP and a message."""

    seconds: Finite = 0.0
    status: Status = "unknown"
    slots: int | None = None
    message: str | None = None


_PIPELINE_FIELDS = (
    "assignment",
    "period",
    "throughput",
    "batches_per_period",
    "weight_versions",
    "link_bandwidth",
    "gpu_memory",
    "pattern",
    "transfers",
)
"""Pipeline-family fields, left out of the documents of the other families."""


class PatternOp(_Model):
    """One compute operation of a pipeline pattern (*Pipelined Model Parallelism*, Euro-Par 2021, Definition 1).

    In the ``i``-th copy of the pattern (times shifted by ``i * period``) it runs on mini-batch
    ``batches_per_period * i - shift``.
    """

    op: Literal["F", "B"]
    stage: int = Field(ge=0)
    start: float = Field(allow_inf_nan=False)
    end: float = Field(allow_inf_nan=False)
    shift: int = Field(ge=-MAX_SHIFT, le=MAX_SHIFT)


class GpuPattern(_Model):
    """The operations one GPU runs in every period, in start order."""

    gpu: int = Field(ge=0)
    ops: list[PatternOp] = []


class PatternTransfer(_Model):
    """One communication of a pipeline pattern: ``x[k]`` forward or ``g[k]`` backward.

    ``stage`` is the stage boundary ``k``: ``x[k]`` goes from stage ``k-1`` to stage ``k``,
    ``g[k]`` from stage ``k`` back to stage ``k-1``. It occupies the link ``{src, dst}``.
    """

    tensor: Literal["x", "g"]
    stage: int = Field(ge=1)
    src: int = Field(ge=0)
    dst: int = Field(ge=0)
    start: float = Field(allow_inf_nan=False)
    end: float = Field(allow_inf_nan=False)
    shift: int = Field(ge=-MAX_SHIFT, le=MAX_SHIFT)


def overhead_ratio(makespan: float, lower_bound: float) -> float | None:
    """A schedule's ``overhead``: ``makespan / lower_bound``, 1.0 without a bound.

    None when the ratio is too large for a float (a denormal lower bound).
    """
    if lower_bound <= 0:
        return 1.0
    ratio = makespan / lower_bound
    return ratio if math.isfinite(ratio) else None


class Schedule(_Model):
    """A training schedule and the figures the solver claims for it (checked by the simulator)."""

    format: Literal["memplan-schedule/1"] = SCHEDULE_FORMAT
    family: str = "chain"
    algorithm: str
    profile: ProfileRef
    budget: Budget
    feasible: bool
    makespan: Finite | None = None
    lower_bound: Finite
    overhead: Finite | None = Field(
        default=None, description="makespan / lower_bound (1.0 = no recomputation)"
    )
    peak_memory: Size | None = None
    static_memory: Size = 0
    min_memory: int | None = Field(
        default=None, description="least budget with which this algorithm finds a plan, if known"
    )
    solver: SolverInfo = SolverInfo()
    ops: list[Op] = []

    # -- join family (*Optimal Memory-aware Backpropagation of Deep Join Networks*): its fields go here --
    join_model: Literal["pebble", "chain"] | None = Field(
        default=None,
        description="join schedules: the memory model of the ops (docs/join.md): 'pebble' (the "
        "paper's unit-slot model) or 'chain' (docs/model.md on every branch)",
    )
    join_slots: int | None = Field(
        default=None,
        description="join schedules, pebble model: the budget in the paper's memory slots (c)",
    )

    # -- graph family (OLLA, Steiner et al.): its fields go here --
    order: list[str] | None = Field(
        default=None, description="graph family: every node name once, in execution order"
    )
    addresses: dict[str, int] | None = Field(
        default=None, description="graph family: tensor name -> byte offset in the arena"
    )
    arena: int | None = Field(
        default=None, description="graph family: bytes of the arena, max(offset + size)"
    )
    peak_resident: int | None = Field(
        default=None, description="graph family: peak of the bytes live at one step (no gaps)"
    )
    fragmentation: Finite | None = Field(
        default=None, description="graph family: (arena - peak_resident) / arena"
    )
    memory_bound: int | None = Field(
        default=None, description="graph family: the solver's proven lower bound on its objective"
    )

    # -- pipeline family (*Pipelined Model Parallelism*, Euro-Par 2021): its fields go here --
    assignment: list[NonNegativeInt] | None = Field(
        default=None, description="pipeline: the GPU of each stage (forward and backward)"
    )
    period: Finite | None = Field(default=None, description="pipeline: period of the pattern, ms")
    throughput: Finite | None = Field(default=None, description="pipeline: samples/s")
    batches_per_period: int | None = Field(default=None, ge=1)
    weight_versions: int | None = Field(
        default=None, ge=1, description="pipeline: weight versions kept (2 for 2BW, 1 for GPipe)"
    )
    link_bandwidth: Rate | None = Field(
        default=None, description="pipeline: bytes/s of each GPU-to-GPU link (None: free)"
    )
    gpu_memory: list[Size] | None = Field(
        default=None, description="pipeline: simulated peak of each GPU, bytes"
    )
    pattern: list[GpuPattern] | None = None
    transfers: list[PatternTransfer] | None = None

    _solver_makespan: float | None = PrivateAttr(default=None)

    @property
    def claimed_makespan(self) -> float | None:
        """The makespan the replay must reproduce.

        The solver's own value for its plan (a dynamic program's optimum, see
        :meth:`with_solver_makespan`), else the stated ``makespan``.
        """
        return self.makespan if self._solver_makespan is None else self._solver_makespan

    def with_solver_makespan(self, value: float | None) -> Schedule:
        """A copy with the solver's own makespan for its plan (None: none).

        :func:`memplan.solve` compares it with the replay, then drops it. It is not part of the
        document: ``makespan`` is the end of the last operation as timed, equal to the solver's
        value up to float rounding.
        """
        copy = self.model_copy()
        copy._solver_makespan = value
        return copy

    @model_validator(mode="after")
    def _fields_of_its_family(self) -> Schedule:
        """No field of another family: a chain schedule with a ``pattern`` says two things."""
        for family, names in _FIELDS_OF.items():
            if family == self.family:
                continue
            for name in names:
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}: a field of {family} schedules, this one is {self.family}"
                    )
        transfers = self.family in ("offload", "combined")
        for index, op in enumerate(self.ops):
            if op.branch is not None and self.family != "join":
                raise ValueError(
                    f"ops[{index}].branch: a field of join schedules, this one is {self.family}"
                )
            if op.option is not None and not (self.family == "chain" and op.op == "F_all"):
                raise ValueError(
                    f"ops[{index}].option: only the F_all of chain schedules run under an option "
                    f"(this is a {op.op} of a {self.family} schedule)"
                )
            if op.tensor is not None and not (transfers and op.stream == "transfer"):
                raise ValueError(
                    f"ops[{index}].tensor: only the transfers of offload and combined schedules "
                    f"name a tensor (this is a {op.op} of a {self.family} schedule)"
                )
        return self

    @model_serializer(mode="wrap")
    def _drop_unset_family_fields(self, handler: Any) -> dict[str, Any]:
        """Leave the other families' unset fields out of the documents."""
        data: dict[str, Any] = handler(self)
        for key in _FAMILY_FIELDS:
            if data.get(key, 0) is None:
                data.pop(key)
        return data

    def to_dict(self) -> dict[str, Any]:
        """The schedule as a JSON-ready document."""
        return self.model_dump(mode="json")

    def to_json(self, indent: int | None = 2) -> str:
        """The schedule as JSON text (``indent`` as :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_yaml(self) -> str:
        """The schedule as YAML text."""
        return dump_yaml(self.to_dict())

    def count(self, op: str) -> int:
        """How many operations of one kind (``"F_all"``, ``"B"``, ...) the plan runs."""
        return sum(1 for o in self.ops if o.op == op)


_FIELDS_OF = {
    "join": ("join_model", "join_slots"),
    "graph": ("order", "addresses", "arena", "peak_resident", "fragmentation", "memory_bound"),
    "pipeline": _PIPELINE_FIELDS,
}
"""The fields only one family's schedules have (the validator refuses them elsewhere)."""

_FAMILY_FIELDS = tuple(name for names in _FIELDS_OF.values() for name in names)
"""Family fields left out of the documents when unset (the join, graph and pipeline families')."""


def schedule_from_dict(data: Any, source: str = "<schedule>") -> Schedule:
    """Validate a parsed document as a schedule (InputError naming the field on failure)."""
    if data is None:
        raise empty_input(source, f"a schedule with 'format: {SCHEDULE_FORMAT}'")
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with 'format: {SCHEDULE_FORMAT}'")
    if data.get("format") != SCHEDULE_FORMAT:
        raise InputError(
            f"{source}: format: expected {SCHEDULE_FORMAT!r}, got {data.get('format')!r}"
        )
    try:
        return Schedule.model_validate(data, strict=True)
    except ValidationError as exc:
        raise InputError(validation_message(source, exc)) from None


def load_schedule(source: Any) -> Schedule:
    """Load a schedule from a :class:`Schedule`, a dict, a path or ``-`` (JSON or YAML)."""
    if isinstance(source, Schedule):
        return source
    if isinstance(source, dict):
        return schedule_from_dict(source)
    data, name = read_document(source)
    return schedule_from_dict(data, name)
