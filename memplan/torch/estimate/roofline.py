"""Estimate GPU times from operator counts: a roofline per aten operator (``roofline/1``).

A stage's forward and backward run once under :class:`OpCounter` (on fake tensors by default,
:mod:`memplan.torch.measure.fake`; on real CPU or CUDA tensors with ``--device``), a ``TorchDispatchMode``
that records, for every aten operator call that launches a kernel:

* FLOPs, from ``torch.utils.flop_counter.flop_registry`` (matrix products, convolutions, fused
  attention), plus the CPU flash-attention operators that the registry does not list; 0 otherwise;
* bytes read: the distinct input tensors, each counted once per call (``x + x`` reads ``x`` once);
* bytes written: the distinct output tensors;
* its kind, ``matmul`` (FLOP-heavy, may use tensor cores) or ``memory`` (everything else).

View and metadata operators (``view``, ``t``, ``expand``, ``detach``, ``empty``, ``prim.device``...)
move no data and launch no kernel: they are not recorded. A tensor's bytes are those of the distinct elements it
addresses (an expanded bias counts once), at most its storage.

The time of an operator on a :class:`~memplan.gpu.GpuSpec` is

``max(flops / (peak[dtype, kind] * efficiency), bytes / (hbm_bandwidth * efficiency.memory))
+ launch_cost``

and a stage's forward (backward) time is the sum over its forward (backward) operators. TF32
follows PyTorch's flags at the time of the estimate (:func:`tf32_flags`): by default on for
convolutions (``torch.backends.cudnn.allow_tf32 = True``) and off for matrix products and attention
(``torch.backends.cuda.matmul.allow_tf32 = False``). docs/estimation.md has the details and the
limits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.flop_counter as flop_counter
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from memplan.gpu import GpuSpec

__all__ = [
    "ESTIMATE_MODEL",
    "OpCounter",
    "OpRecord",
    "OpTime",
    "PhaseEstimate",
    "StageEstimate",
    "Tf32",
    "count_ops",
    "estimate_info",
    "estimate_phase",
    "estimate_stage",
    "op_time",
    "tf32_flags",
]

ESTIMATE_MODEL = "roofline/1"
"""Name of the estimation model, recorded in ``measured.estimate.model``."""

aten = torch.ops.aten

_CONV = {
    aten.convolution,
    aten._convolution,
    aten.convolution_backward,
    aten.cudnn_convolution,
    aten.convolution_overrideable,
    aten._slow_conv2d_forward,
}
"""Convolutions: TF32 follows ``torch.backends.cudnn.allow_tf32``."""

_MATMUL = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._scaled_mm}

_CPU_ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu: "forward",
    aten._scaled_dot_product_flash_attention_for_cpu_backward: "backward",
}
"""Fused attention on CPU: not in torch's FLOP registry, counted with its SDPA formulas."""

_NO_KERNEL = {
    aten._unsafe_view,
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    aten._local_scalar_dense,
    aten.resize_,
    aten.set_,
    aten.lift_fresh,
    aten.lift_fresh_copy,
    aten.is_same_size,
    aten._has_compatible_shallow_copy_type,
}
"""Allocation and metadata operators that are not views but launch no kernel."""

_SHAPE_ONLY = {
    aten.zeros_like,
    aten.ones_like,
    aten.full_like,
    aten.rand_like,
    aten.randn_like,
    aten.randint_like,
    aten.new_zeros,
    aten.new_ones,
    aten.new_full,
}
"""Operators that read only the shape of their tensor argument: nothing read."""

_OVERWRITE = {
    aten.copy_,
    aten.fill_,
    aten.zero_,
    aten.uniform_,
    aten.normal_,
    aten.bernoulli_,
    aten.random_,
    aten.exponential_,
}
"""In-place operators that overwrite their first argument without reading it."""


def _is_attention(packet: Any) -> bool:
    name = getattr(packet, "__name__", "")
    return "scaled_dot_product" in name or name.startswith(("_flash_attention", "_efficient_att"))


@dataclass(frozen=True)
class OpRecord:
    """One recorded aten operator call.

    Attributes
    ----------
    name : str
        The operator (``aten.convolution.default``).
    kind : str
        ``matmul`` (products, convolutions, attention) or ``memory`` (everything else).
    dtype : str
        Data type of its first floating-point input (``float32``...), else of its first tensor.
    flops : int
        Floating-point operations (a multiply-add counts 2).
    bytes_read, bytes_written : int
        Distinct input and output tensors, each counted once.
    tf32 : bool
        Whether a float32 operator of this kind may use TF32 tensor cores (the flags at record
        time: cuDNN's for convolutions, cuBLAS's for matrix products and attention).
    """

    name: str
    kind: str
    dtype: str
    flops: int
    bytes_read: int
    bytes_written: int
    tf32: bool = False

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class Tf32:
    """Whether float32 convolutions and matrix products may run on TF32 tensor cores."""

    conv: bool = True
    matmul: bool = False

    def to_dict(self) -> dict[str, bool]:
        return {"conv": self.conv, "matmul": self.matmul}


def tf32_flags() -> Tf32:
    """PyTorch's current TF32 flags (defaults: convolutions True, matrix products False).

    ``torch.backends.cudnn.allow_tf32`` governs convolutions; ``torch.backends.cuda.matmul
    .allow_tf32`` (``torch.set_float32_matmul_precision("high")``) matrix products and attention.
    Both can be read and set on a CPU-only build.
    """
    try:
        matmul = bool(torch.backends.cuda.matmul.allow_tf32)
    except (RuntimeError, AttributeError):  # pragma: no cover - very old torch
        matmul = torch.get_float32_matmul_precision() != "highest"
    return Tf32(conv=bool(torch.backends.cudnn.allow_tf32), matmul=matmul)


_GATHER = {
    aten.embedding,
    aten.index_select,
    aten.gather,
    aten.index,
    aten.take,
}
"""Operators that read only the rows they gather from their first argument (the table), not all
of it: the table counts as many bytes as the operator writes, at most its own size."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_bytes(tensor: Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses: broadcast (stride 0) dims count once."""
    elements = 1
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        if size == 0:
            return 0
        if stride != 0:
            elements *= size
    nbytes = elements * tensor.element_size()
    try:
        storage = tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return nbytes
    return min(nbytes, storage) if storage else nbytes


def _tensor_key(tensor: Tensor) -> tuple[Any, ...]:
    """Identity of the memory a tensor addresses, so that each is counted once per call.

    The storage is told apart by its identity, not its data pointer: fake tensors
    (:mod:`memplan.torch.measure.fake`) have no data, and a real storage has one pointer anyway.
    """
    try:
        storage: Any = tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):
        storage = id(tensor)
    return (storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))


def _distinct_bytes(tensors: Sequence[Tensor]) -> int:
    seen: dict[tuple[Any, ...], int] = {}
    for tensor in tensors:
        key = _tensor_key(tensor)
        if key not in seen:
            seen[key] = _tensor_bytes(tensor)
    return sum(seen.values())


def _tensors(tree: Any) -> list[Tensor]:
    leaves, _ = tree_flatten(tree)
    return [leaf for leaf in leaves if isinstance(leaf, Tensor)]


def _flops(packet: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> int:
    formula = flop_counter.flop_registry.get(packet)
    if formula is not None:
        return int(formula(*args, **kwargs, out_val=out))
    which = _CPU_ATTENTION.get(packet)
    if which == "forward":
        q, k, v = args[:3]
        return int(flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape))
    if which == "backward":
        grad_out, q, k, v = args[:4]
        return int(flop_counter.sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape))
    return 0


class OpCounter(TorchDispatchMode):
    """Record every kernel-launching aten operator call, by phase.

    Use :meth:`counting` around a forward and, separately, its backward; the records are in
    ``ops[phase]``. The counter keeps no reference to any tensor (only integers and names), so it
    does not change the memory a measurement sees.

    Examples
    --------
    >>> import torch
    >>> counter = OpCounter()
    >>> x = torch.ones(4, 4)
    >>> with counter.counting("forward"):
    ...     y = x + x
    >>> [(op.name, op.bytes_read, op.bytes_written) for op in counter.ops["forward"]]
    [('aten.add.Tensor', 64, 64)]
    """

    def __init__(self, tf32: Tf32 | None = None) -> None:
        super().__init__()
        self.tf32 = tf32_flags() if tf32 is None else tf32
        self.ops: dict[str, list[OpRecord]] = {}
        self._phase = "forward"

    @contextmanager
    def counting(self, phase: str) -> Iterator[OpCounter]:
        """Record the operators run inside the block under ``phase`` (``forward``...)."""
        previous, self._phase = self._phase, phase
        self.ops.setdefault(phase, [])
        try:
            with self:
                yield self
        finally:
            self._phase = previous

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if func.is_view or packet in _NO_KERNEL or func.namespace == "prim":
            return out  # prim: metadata queries (``prim.device`` of a fake tensor)
        self.ops.setdefault(self._phase, []).append(self._record(func, packet, args, kwargs, out))
        return out

    def _record(
        self, func: Any, packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> OpRecord:
        inputs = _tensors((args, {k: v for k, v in kwargs.items() if k != "out"}))
        outputs = _tensors(out)
        floating = [t for t in inputs if t.is_floating_point()]
        reference = floating or inputs or outputs
        if packet in _SHAPE_ONLY:
            inputs = []
        elif packet in _OVERWRITE and args and isinstance(args[0], Tensor):
            inputs = _tensors((args[1:], kwargs))
        gathered = 0
        if packet in _GATHER and args and isinstance(args[0], Tensor):
            # NOTE: embedding(weight, indices) reads the looked-up rows, not the whole table.
            gathered = min(_tensor_bytes(args[0]), _distinct_bytes(outputs))
            inputs = _tensors((args[1:], kwargs))
        dtype = _dtype_name(reference[0].dtype) if reference else "float32"
        is_conv = packet in _CONV
        matmul = is_conv or packet in _MATMUL or _is_attention(packet)
        flops = _flops(packet, args, kwargs, out)
        if flops:
            matmul = True
        return OpRecord(
            name=str(func),
            kind="matmul" if matmul else "memory",
            dtype=dtype,
            flops=flops,
            bytes_read=_distinct_bytes(inputs) + gathered,
            bytes_written=_distinct_bytes(outputs),
            tf32=self.tf32.conv if is_conv else self.tf32.matmul,
        )


def count_ops(fn: Any, *, tf32: Tf32 | None = None) -> list[OpRecord]:
    """Run ``fn()`` under an :class:`OpCounter` and return its records."""
    counter = OpCounter(tf32)
    with counter.counting("run"):
        fn()
    return counter.ops["run"]


# --------------------------------------------------------------------------------------------
# The roofline
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpTime:
    """Seconds of one operator: its compute and memory terms, the launch cost and the total."""

    compute: float
    memory: float
    launch: float

    @property
    def total(self) -> float:
        return max(self.compute, self.memory) + self.launch

    @property
    def bound(self) -> str:
        return "compute" if self.compute > self.memory else "memory"


def _peak(op: OpRecord, gpu: GpuSpec) -> float:
    """Achievable FLOP/s for a matmul-kind operator: the dtype's peak times its efficiency."""
    peaks, eff = gpu.peak_flops, gpu.efficiency
    tensor_rate = {"float16": peaks.float16, "bfloat16": peaks.bfloat16}.get(op.dtype)
    if op.dtype == "float32" and op.tf32:
        tensor_rate = peaks.tf32
    if tensor_rate is not None:
        return tensor_rate * eff.tensor_core
    # float32 without TF32, a 16-bit type without tensor cores (bfloat16 on Volta), float64...
    return peaks.float32 * eff.cuda_core


def op_time(op: OpRecord, gpu: GpuSpec) -> OpTime:
    """The roofline time of one operator on ``gpu``."""
    compute = op.flops / _peak(op, gpu) if op.flops else 0.0
    memory = op.bytes / (gpu.hbm_bandwidth * gpu.efficiency.memory)
    return OpTime(compute=compute, memory=memory, launch=gpu.launch_cost)


@dataclass(frozen=True)
class PhaseEstimate:
    """A forward or a backward: totals of its operators.

    ``compute`` (``memory``) sums the roofline term of the operators whose compute (memory) term
    is the larger; ``seconds = compute + memory + launch``.
    """

    seconds: float = 0.0
    flops: int = 0
    bytes: int = 0
    kernels: int = 0
    compute: float = 0.0
    memory: float = 0.0
    launch: float = 0.0


def estimate_phase(ops: Sequence[OpRecord], gpu: GpuSpec) -> PhaseEstimate:
    """Sum the roofline times of ``ops`` on ``gpu``."""
    compute = memory = launch = 0.0
    for op in ops:
        t = op_time(op, gpu)
        if t.bound == "compute":
            compute += t.compute
        else:
            memory += t.memory
        launch += t.launch
    return PhaseEstimate(
        seconds=compute + memory + launch,
        flops=sum(op.flops for op in ops),
        bytes=sum(op.bytes for op in ops),
        kernels=len(ops),
        compute=compute,
        memory=memory,
        launch=launch,
    )


@dataclass(frozen=True)
class StageEstimate:
    """Forward and backward estimates of one stage."""

    forward: PhaseEstimate = field(default_factory=PhaseEstimate)
    backward: PhaseEstimate = field(default_factory=PhaseEstimate)

    @property
    def forward_ms(self) -> float:
        return round(self.forward.seconds * 1000.0, 6)

    @property
    def backward_ms(self) -> float:
        return round(self.backward.seconds * 1000.0, 6)

    @property
    def bound(self) -> str:
        """``compute`` when the compute terms outweigh the memory terms over forward + backward."""
        compute = self.forward.compute + self.backward.compute
        memory = self.forward.memory + self.backward.memory
        return "compute" if compute > memory else "memory"

    def to_extra(self) -> dict[str, Any]:
        """What a stage's ``extra.estimate`` holds (counts; the three time terms in ms)."""
        f, b = self.forward, self.backward
        return {
            "forward_flops": f.flops,
            "backward_flops": b.flops,
            "forward_bytes": f.bytes,
            "backward_bytes": b.bytes,
            "forward_kernels": f.kernels,
            "backward_kernels": b.kernels,
            "bound": self.bound,
            "compute_ms": round((f.compute + b.compute) * 1000.0, 6),
            "memory_ms": round((f.memory + b.memory) * 1000.0, 6),
            "launch_ms": round((f.launch + b.launch) * 1000.0, 6),
        }


def estimate_stage(counter: OpCounter, gpu: GpuSpec) -> StageEstimate:
    """The estimate of a stage whose forward and backward ran under ``counter``."""
    return StageEstimate(
        forward=estimate_phase(counter.ops.get("forward", []), gpu),
        backward=estimate_phase(counter.ops.get("backward", []), gpu),
    )


def estimate_info(gpu: GpuSpec, tf32: Tf32, catalog_key: str | None) -> dict[str, Any]:
    """What ``measured.estimate`` of an estimated profile records: the model and its inputs."""
    info: dict[str, Any] = {"model": ESTIMATE_MODEL}
    if catalog_key is not None:
        info["catalog"] = catalog_key
    info["tf32"] = tf32.to_dict()
    info["gpu"] = gpu.to_dict()
    return info
