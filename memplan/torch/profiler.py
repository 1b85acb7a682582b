"""Measure a model stage by stage and return a ``memplan-profile/1`` :class:`~memplan.Profile`.

For each stage ``k`` of the chain (see :mod:`memplan.torch.linearize`) the profiler feeds the
stage the output of stage ``k-1`` and runs one warm-up iteration, one instrumented iteration and
``repeats`` timed iterations (an iteration is the stage's forward then its backward):

``forward_time`` / ``backward_time``
    Median over the timed iterations, ``time.perf_counter`` around the call, after
    ``torch.cuda.synchronize`` on CUDA.
``output_size``
    Bytes of the storage of the stage output x_{k+1}.
``saved_size``
    Bytes of the tensors autograd saves for the backward (``saved_tensors_hooks``): the union of
    their storages, each counted once, without the storage of the stage input x_k and without
    parameters and buffers (static memory), plus the output storage when it is not among them.
``forward_overhead`` / ``backward_overhead``
    Temporary memory. On CPU, from the allocator events of ``torch.profiler`` (``profile_memory``);
    on CUDA, from ``torch.cuda.max_memory_allocated``. The forward is measured twice, inside the
    runtime's recomputation context (:func:`memplan.torch.recompute.recomputing`): with autograd
    (the peak beyond ``saved_size``, as ``F_all`` runs) and without (the peak beyond the output,
    as ``F_ck``/``F_n`` run); the larger counts. The backward's peak beyond the gradient of the
    input, measured with the weight gradients already allocated (the per-operator weight
    gradient is a temporary added into them). Clamped at 0.
``weight_size``
    What the stage keeps between iterations: its parameters (a parameter shared by stages counts
    in the first one), its buffers, 4 bytes per parameter tensor (Adam's step count), and for
    the loss stage the loss and its gradient (:func:`kept_bytes`, docs/runtime.md).
``bandwidth`` (of the profile)
    The host<->device copy rate (:mod:`memplan.torch.bandwidth`): pinned copies on CUDA, the
    runtime's own offload copy on CPU.

On CUDA every size is rounded up to the caching allocator's 512-byte blocks
(:func:`memplan.torch.memory_probe.allocation_bytes`).

The chain is checked against the model on one sample (:func:`linearize_on_sample`).

With ``estimate=GPU`` (or ``gpu_spec=FILE``) the times are estimated for that GPU from
per-operator FLOP and byte counts (:mod:`memplan.torch.estimate`) and the timed iterations are
skipped; with ``device="auto"`` the stages run on fake tensors (:mod:`memplan.torch.fake`): the
same sizes as on CPU without computing anything.

docs/profiling.md describes the method and its approximations; docs/estimation.md the estimate.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.gpu import GpuSpec, gpu_catalog, gpu_from_dict, load_gpu, load_gpu_file
from memplan.interrupt import interrupt_within
from memplan.profile.model import Device, Measured, Noise, Profile, Stage, StageOption
from memplan.torch.bandwidth import measure_bandwidth, offload_copy_bytes, profile_bandwidth
from memplan.torch.blame import FIRST_FORWARD, model_errors
from memplan.torch.chunked_loss import LOSS_CHUNKS, chunk_loss
from memplan.torch.conditions import current_conditions, intra_op_threads
from memplan.torch.device import describe_device, resolve_device
from memplan.torch.estimate import OpCounter, estimate_info, estimate_stage, tf32_flags
from memplan.torch.identical import stage_signature
from memplan.torch.linearize import Chain, linearize, make_loss, traces_its_input
from memplan.torch.memory_probe import (
    CpuProbe,
    CudaProbe,
    MemoryProbe,
    allocation_bytes,
    storage_key,
)
from memplan.torch.models import build_model
from memplan.torch.models import example_input as default_example_input
from memplan.torch.recompute import recomputing
from memplan.torch.selective import POLICIES, cached_storages, contexts
from memplan.torch.timing import Summary, profile_noise, summarize

__all__ = [
    "DTYPES",
    "StageMeasurement",
    "linearize_on_sample",
    "measure_bandwidth",
    "measure_stage",
    "profile_chain",
    "profile_model",
    "resolve_gpu",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The data types ``--dtype`` accepts."""

ProgressCallback = Callable[[str, int, int], None]


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def storage_bytes(tensor: Tensor | None) -> int:
    key = None if tensor is None else storage_key(tensor)
    return 0 if key is None else key[1]


def _static_pointers(module: nn.Module) -> set[int]:
    """Storage pointers of a module's parameters and buffers (static memory, never 'saved')."""
    keys = (storage_key(t) for t in [*module.parameters(), *module.buffers()])
    return {key[0] for key in keys if key is not None}


def _clear_grads(module: nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def _median_ms(samples: Iterable[float]) -> float:
    return round(statistics.median(samples) * 1000.0, 6)


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


# --------------------------------------------------------------------------------------------
# One stage
# --------------------------------------------------------------------------------------------


LONG_ITERATION_S = 2.0
LONG_REPEATS = 3
"""A stage whose warm-up iteration takes at least ``LONG_ITERATION_S`` seconds is timed at most
``LONG_REPEATS`` times: the jitter that repeats average out is small beside such an iteration,
and a language model's head at 128,256 tokens takes tens of seconds per iteration on a CPU."""


@dataclass
class StageMeasurement:
    """What :func:`measure_stage` finds for one stage (sizes in bytes, times in ms).

    Attributes
    ----------
    output : Tensor
        The stage output, detached: the next stage's input.
    grad_size : int
        Bytes of the gradient of the output (dense, the output's shape and data type).
    weight_grad_size : int or None
        Bytes of the parameter gradients the backward creates when they are None before it
        (``creates_grads`` of :func:`measure_stage`; None when not measured).
    backward_overhead_fresh : int or None
        The backward's temporary bytes in that case, beyond the input gradient and them.
    forward_overhead_all : int or None
        The temporary bytes of the forward with autograd alone (``F_all``), beyond what it saves.
    input_saved, output_saved : bool or None
        Whether autograd saved the storage of the stage's input (output) for the backward.
    iteration_times : list of float
        Seconds of each timed iteration (forward + backward).
    """

    forward_time: float
    backward_time: float
    output_size: int
    grad_size: int
    saved_size: int
    forward_overhead: int
    backward_overhead: int
    output: Tensor
    weight_grad_size: int | None = None
    backward_overhead_fresh: int | None = None
    forward_overhead_all: int | None = None
    input_saved: bool | None = None
    output_saved: bool | None = None
    iteration_times: list[float] = field(default_factory=list)
    options: list[StageOption] | None = None


class _StageRunner:
    """Runs one stage, forward then backward, each time on a fresh copy of its input."""

    def __init__(self, module: nn.Module, x: Tensor, input_grad: bool) -> None:
        self.module = module
        self.x = x
        self.input_grad = input_grad and x.is_floating_point()
        self.sync = _synchronizer(x.device)

    def fresh_input(self) -> tuple[Tensor | None, Tensor]:
        """(leaf receiving the input gradient or None, the tensor the stage reads)."""
        _clear_grads(self.module)
        if self.input_grad:
            leaf = self.x.detach().requires_grad_(True)
            return leaf, leaf.clone()  # a stage may work in place on its input
        return None, self.x.clone()

    def forward(self, inp: Tensor) -> Tensor:
        out = self.module(inp)
        if not isinstance(out, Tensor):
            raise InputError(
                f"stage {type(self.module).__name__} returns {type(out).__name__}, not a tensor"
            )
        return out

    @staticmethod
    def output_gradient(out: Tensor) -> Tensor | None:
        return torch.ones_like(out) if out.requires_grad else None

    def timed(self, counter: OpCounter | None = None) -> tuple[float, float, Tensor]:
        """One iteration: (forward seconds, backward seconds, detached output).

        With ``counter``, the forward and the backward run under ``counter.counting("forward")``
        and ``counter.counting("backward")`` (the input copy and the output gradient do not).
        """

        def phase(name: str) -> Any:
            return nullcontext() if counter is None else counter.counting(name)

        _, inp = self.fresh_input()
        self.sync()
        start = time.perf_counter()
        with phase("forward"):
            out = self.forward(inp)
        self.sync()
        forward = time.perf_counter() - start
        grad = self.output_gradient(out)
        backward = 0.0
        if grad is not None:
            self.sync()
            start = time.perf_counter()
            with phase("backward"):
                out.backward(grad)
            self.sync()
            backward = time.perf_counter() - start
        return forward, backward, out.detach()


def kept_bytes(module: nn.Module, params: list[Tensor], device: torch.device) -> int:
    """``weight_size`` of a stage: the bytes it keeps in device memory from one iteration to
    the next, per copy the optimizer makes (docs/runtime.md).

    Its parameters (``params``: those no earlier stage counted), its buffers (batch-norm
    statistics, the loss targets: no gradient or optimizer state, counted like the weights,
    a little more than needed) and, per parameter tensor, a 4-byte scalar: the step count
    ``torch.optim.Adam`` keeps in device memory beside each parameter's moments.
    """
    total = sum(allocation_bytes(p.numel() * p.element_size(), device) for p in params)
    total += len(params) * allocation_bytes(4, device)
    return total + sum(
        allocation_bytes(b.numel() * b.element_size(), device) for b in module.buffers()
    )


@dataclass
class _Sizes:
    """What the instrumented iteration finds (bytes as the allocator counts them)."""

    output_size: int
    grad_size: int
    saved_size: int
    forward_overhead: int
    forward_overhead_all: int
    backward_overhead: int
    input_saved: bool
    output_saved: bool


def _instrumented(runner: _StageRunner, probe: MemoryProbe, static: set[int]) -> _Sizes:
    """One iteration under the memory probe and ``saved_tensors_hooks``, as the runtime runs it.

    The forward runs twice, both times inside :func:`memplan.torch.recompute.recomputing` (the
    copies of the buffers and the RNG state a recomputation holds count): without autograd, as
    ``F_ck``/``F_n`` run, and with it, as ``F_all`` runs; the forward overhead covers both. The
    backward runs with the weight gradients already allocated (zeros), as in a training loop that
    keeps them from one iteration to the next: the gradient each operator computes is a temporary
    added into them.

    Returns
    -------
    _Sizes
        Sizes as the allocator counts them (:func:`memplan.torch.memory_probe.allocation_bytes`);
        ``forward_overhead_all`` is the forward with autograd's alone; ``input_saved`` and
        ``output_saved`` say whether autograd saved the storage of the stage's input or output.
    """
    device = runner.x.device
    _, inp = runner.fresh_input()
    plain: list[Tensor] = []

    def forward_without_autograd() -> None:
        with recomputing(runner.module, None, device), torch.no_grad():
            plain.append(runner.forward(inp))

    runner.sync()
    plain_peak = probe.peak(forward_without_autograd, dict)
    plain_out = storage_key(plain.pop())
    plain_output = 0 if plain_out is None or plain_out == storage_key(inp) else plain_out[1]
    plain_overhead = plain_peak - allocation_bytes(plain_output, device)
    del inp

    leaf, inp = runner.fresh_input()
    saved: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        key = storage_key(tensor)
        if key is not None:
            saved.setdefault(*key)
        return tensor

    result: list[Tensor] = []

    def forward() -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
        with recomputing(runner.module, None, device), hooks:
            result.append(runner.forward(inp))

    runner.sync()
    forward_peak = probe.peak(forward, dict)
    out = result.pop()
    excluded = set(static)
    for tensor in (inp, leaf):  # the stage input x_k is not part of x-bar_k
        key = None if tensor is None else storage_key(tensor)
        if key is not None:
            excluded.add(key[0])
    kept = {
        ptr: allocation_bytes(nbytes, device)
        for ptr, nbytes in saved.items()
        if ptr not in excluded
    }
    out_key = storage_key(out)
    inp_key = storage_key(inp)
    input_saved = inp_key is not None and inp_key[0] in saved
    output_saved = out_key is not None and out_key[0] in saved
    output_size = 0 if out_key is None else allocation_bytes(out_key[1], device)
    saved_size = sum(kept.values()) + (output_size if out_key and out_key[0] not in kept else 0)
    grad_size = allocation_bytes(out.numel() * out.element_size(), device)

    backward_overhead = 0
    grad = runner.output_gradient(out)
    if grad is not None:
        _allocate_grads(runner.module, lambda _param: True)
        runner.sync()
        backward_peak = probe.peak(lambda: out.backward(grad), dict)
        input_grad_size = storage_bytes(None if leaf is None else leaf.grad)
        backward_overhead = max(0, backward_peak - allocation_bytes(input_grad_size, device))
        _clear_grads(runner.module)
    forward_all = max(0, forward_peak - saved_size)
    return _Sizes(
        output_size=output_size,
        grad_size=grad_size,
        saved_size=saved_size,
        forward_overhead=max(forward_all, plain_overhead),
        forward_overhead_all=forward_all,
        backward_overhead=backward_overhead,
        input_saved=input_saved,
        output_saved=output_saved,
    )


def _same(tensor: Tensor) -> Tensor:
    return tensor


def _allocate_grads(module: nn.Module, which: Callable[[Tensor], bool]) -> None:
    """Zero gradients for the parameters ``which`` accepts (as a loop keeping them has them)."""
    with torch.no_grad():
        for param in module.parameters():
            if param.requires_grad and which(param):
                param.grad = torch.zeros_like(param)


def _fresh_backward(
    runner: _StageRunner, probe: MemoryProbe, creates: Collection[int]
) -> tuple[int, int]:
    """A forward (as ``F_all`` runs) and a backward measured as PyTorch's default loop runs it:
    the gradients of the parameters in ``creates`` (ids) are None before it, so that the backward
    creates them; the stage's other parameters (shared with a later stage, whose backward comes
    first and creates their gradients) have theirs already.

    Returns
    -------
    (int, int)
        ``(weight_grad_size, backward_overhead_fresh)``: the bytes of the gradients created, and
        the peak beyond them and the input gradient, relative to the backward's start (what the
        forward saved included). Negative when the backward frees saved tensors before it has
        created every gradient: the sum of the two is the peak, neither short of it nor above.
    """
    device = runner.x.device
    leaf, inp = runner.fresh_input()
    # as the runtime's F_all: under saved-tensor hooks, inside the recomputation context (which
    # puts the batch-norm statistics back: without the hooks autograd would see them modified)
    # Under the probe too (its figure unused): on CPU the allocator reports the frees of the
    # blocks it saw allocated under a profiler only, and the backward frees what this saves.
    hooks = torch.autograd.graph.saved_tensors_hooks(_same, _same)
    result: list[Tensor] = []

    def forward() -> None:
        with recomputing(runner.module, None, device), hooks:
            result.append(runner.forward(inp))

    probe.peak(forward, dict)
    out = result.pop()
    grad = runner.output_gradient(out)
    if grad is None:
        return 0, 0
    _allocate_grads(runner.module, lambda param: id(param) not in creates)
    runner.sync()
    peak = probe.peak(lambda: out.backward(grad), dict)
    created: dict[int, int] = {}
    for param in runner.module.parameters():
        key = None if id(param) not in creates or param.grad is None else storage_key(param.grad)
        if key is not None:
            created[key[0]] = allocation_bytes(key[1], device)
    input_grad_size = allocation_bytes(storage_bytes(None if leaf is None else leaf.grad), device)
    weight_grads = sum(created.values())
    _clear_grads(runner.module)
    return weight_grads, peak - input_grad_size - weight_grads


def measure_option(
    runner: _StageRunner, probe: MemoryProbe, static: set[int], policy: str, repeats: int
) -> StageOption:
    """One stage run as an ``F_all`` under a selective policy (:mod:`memplan.torch.selective`),
    as the runtime runs it: the forward keeps the policy's outputs (the SAC cache) and none of
    what autograd saves; the backward starts by running the forward again under the
    recomputation context, which fills what autograd saved, then runs.

    Returns the option: ``saved_size`` (the cache's storages and the output, allocator sizes,
    the input and parameters excluded), ``forward_overhead`` (the forward's peak beyond them),
    ``backward_overhead`` (the peak of the recomputation and the backward beyond the input
    gradient, as ``backward_overhead``) and ``backward_time`` (their median time, ms).
    """
    device = runner.x.device
    sizes: dict[str, int] = {}

    def iteration(measure: bool) -> float:
        leaf, inp = runner.fresh_input()
        if measure:  # the weight gradients allocated, as for backward_overhead
            _allocate_grads(runner.module, lambda _param: True)
        forward, recompute = contexts(policy)
        slots: list[_OptionSlot] = []  # until the recomputation fills them (then autograd's)
        packed: list[Tensor] = []

        def drop(tensor: Tensor) -> Any:
            key = storage_key(tensor)
            if key is not None and key[0] in static:
                return tensor
            slots.append(_OptionSlot())
            return slots[-1]

        def first() -> Tensor:
            hooks = torch.autograd.graph.saved_tensors_hooks(drop, _unpack_option)
            with recomputing(runner.module, None, device), hooks, forward:
                return runner.forward(inp)

        out_box: list[Tensor] = []
        if measure:
            peak = probe.peak(lambda: out_box.append(first()), dict)
        else:
            out_box.append(first())
        out = out_box.pop()
        excluded = set(static) | {k[0] for k in map(storage_key, (inp, leaf)) if k is not None}
        cached = {
            ptr: allocation_bytes(s.nbytes(), device)
            for ptr, s in cached_storages(forward).items()
            if ptr not in excluded
        }
        out_key = storage_key(out)
        output_size = 0 if out_key is None else allocation_bytes(out_key[1], device)
        saved = sum(cached.values()) + (output_size if out_key and out_key[0] not in cached else 0)
        grad = runner.output_gradient(out)

        def backward() -> None:
            def pack(tensor: Tensor) -> None:
                packed.append(tensor.detach())

            fresh = inp.detach().requires_grad_(inp.requires_grad)
            hooks = torch.autograd.graph.saved_tensors_hooks(pack, _same)
            with recomputing(runner.module, None, device), hooks, recompute:
                runner.forward(fresh)
            kept = [t for t in packed if (storage_key(t) or (0,))[0] not in static]
            if len(kept) != len(slots):
                raise RuntimeError(
                    f"its recomputation saved {len(kept)} tensors, its forward {len(slots)}"
                )
            for slot, tensor in zip(slots, kept, strict=True):
                slot.value = tensor
            slots.clear()
            packed.clear()
            kept.clear()
            if grad is not None:
                out.backward(grad)

        if grad is None:
            return 0.0
        runner.sync()
        if measure:
            backward_peak = probe.peak(backward, dict)
            input_grad = storage_bytes(None if leaf is None else leaf.grad)
            sizes["saved"] = saved
            sizes["forward"] = max(0, peak - saved)
            sizes["backward"] = max(0, backward_peak - allocation_bytes(input_grad, device))
            _clear_grads(runner.module)
            return 0.0
        start = time.perf_counter()
        backward()
        runner.sync()
        return time.perf_counter() - start

    iteration(measure=False)  # warm-up
    iteration(measure=True)
    times = [iteration(measure=False) for _ in range(max(1, repeats))]
    _clear_grads(runner.module)
    return StageOption(
        name=policy,
        saved_size=sizes.get("saved", 0),
        forward_overhead=sizes.get("forward", 0),
        backward_overhead=sizes.get("backward", 0),
        backward_time=_median_ms(times),
    )


class _OptionSlot:
    """A saved tensor of a selective forward, filled by its recomputation."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Tensor | None = None


def _unpack_option(packed: Any) -> Any:
    return packed.value if isinstance(packed, _OptionSlot) else packed


def measure_stage(
    module: nn.Module,
    x: Tensor,
    *,
    input_grad: bool,
    repeats: int = 5,
    probe: MemoryProbe | None = None,
    static: set[int] | None = None,
    counter: OpCounter | None = None,
    creates_grads: Collection[int] | None = None,
    policies: Sequence[str] = (),
) -> StageMeasurement:
    """Measure one stage on input ``x``: times, output and saved sizes, temporary memory.

    One warm-up iteration, one instrumented iteration (sizes, memory; with ``creates_grads`` a
    second one, the backward as PyTorch's default loop runs it), then ``repeats`` timed
    iterations. The module should be in the mode to profile (train mode for training).
    With ``counter`` (an estimate), the warm-up iteration runs under the operator counter and the
    timed iterations are skipped: the times are left at 0 for the caller to fill in.

    Parameters
    ----------
    module : nn.Module
        The stage.
    x : Tensor
        Its input x_k. The stage runs on a fresh copy each time (a stage may work in place).
    input_grad : bool
        Whether the backward computes the gradient of ``x`` (False for the chain input).
    repeats : int
        Timed iterations; the median is reported. At most :data:`LONG_REPEATS` for a stage
        whose warm-up iteration took :data:`LONG_ITERATION_S` or more.
    probe : MemoryProbe, optional
        How to measure temporary memory: the CPU or the CUDA probe (by ``x.device``) by default.
    static : set of int, optional
        Storage pointers never counted as saved (parameters and buffers); the module's own
        when omitted.
    counter : OpCounter, optional
        Records the operators of the warm-up forward and backward
        (:mod:`memplan.torch.estimate`); ``repeats`` is then ignored.
    creates_grads : collection of int, optional
        Ids of the parameters whose gradients this stage's backward creates in a loop that sets
        them to None before each iteration (its own, less those shared with a later stage):
        measures ``weight_grad_size`` and ``backward_overhead_fresh``. Not measured when omitted.
    policies : sequence of str
        Selective checkpointing policies (:data:`memplan.torch.selective.POLICIES`) to measure
        the stage's ``F_all`` under (:func:`measure_option`): its ``options``, in that order.

    Returns
    -------
    StageMeasurement
        With ``output`` the (detached) stage output, the next stage's input.
    """
    if probe is None:
        probe = CudaProbe(x.device) if x.device.type == "cuda" else CpuProbe()
    static = _static_pointers(module) if static is None else static
    runner = _StageRunner(module, x, input_grad)
    # warm-up: allocator caches, lazy initialisation, kernel selection (and the operator counts)
    warm_forward, warm_backward, output = runner.timed(counter)
    sizes = _instrumented(runner, probe, static)
    weight_grads = fresh = None
    if creates_grads is not None:
        weight_grads, fresh = _fresh_backward(runner, probe, set(creates_grads))
    forward_times, backward_times = [0.0], [0.0]
    if counter is None:
        forward_times, backward_times = [], []
        if warm_forward + warm_backward >= LONG_ITERATION_S:
            repeats = min(repeats, LONG_REPEATS)
        for _ in range(max(1, repeats)):
            forward, backward, output = runner.timed()
            forward_times.append(forward)
            backward_times.append(backward)
    _clear_grads(module)
    options = None
    if policies and counter is None:
        options = [measure_option(runner, probe, static, p, repeats) for p in policies]
        # An option recomputes what the stage saves: its backward is never faster than the
        # stage's own (a faster measure is noise, which rotor would take for a gain).
        backward = _median_ms(backward_times)
        options = [
            o.model_copy(update={"backward_time": max(o.backward_time, backward)}) for o in options
        ]
    return StageMeasurement(
        options=options,
        forward_time=_median_ms(forward_times),
        backward_time=_median_ms(backward_times),
        output_size=sizes.output_size,
        grad_size=sizes.grad_size,
        saved_size=sizes.saved_size,
        forward_overhead=sizes.forward_overhead,
        backward_overhead=sizes.backward_overhead,
        output=output,
        weight_grad_size=weight_grads,
        backward_overhead_fresh=fresh,
        forward_overhead_all=sizes.forward_overhead_all,
        input_saved=sizes.input_saved,
        output_saved=sizes.output_saved,
        iteration_times=[f + b for f, b in zip(forward_times, backward_times, strict=True)],
    )


# --------------------------------------------------------------------------------------------
# Whole model
# --------------------------------------------------------------------------------------------


@contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread for a small computation, then the caller's count again.

    A one-sample forward gains little from more threads, and on a machine busy with other jobs
    a multi-threaded one waits for preempted threads: 0.44 s on one thread against 2-6 s on two
    for ResNet-50 (docs/benchmarks.md, "Profiling cost"). Nothing measured runs under it.
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


LINEARIZE_SAMPLES = 1
"""Samples of the batch on which :func:`linearize_on_sample` checks the chain."""


def linearize_on_sample(model: nn.Module, x: Tensor, samples: int = LINEARIZE_SAMPLES) -> Chain:
    """:func:`~memplan.torch.linearize.linearize`, checked on the first ``samples`` samples only.

    The check (the chain reproduces the model's output, in eval mode) is about the model's
    structure, not its batch size: running it on the whole batch costs two forwards, more than
    half a training iteration, for nothing more. Chains found by tracing the model (Hugging Face
    models, the generic repeated-block cut: :func:`~memplan.torch.linearize.traces_its_input`) are
    built on the whole batch, their stages being tied to the traced shapes. The loss stage is
    built for the whole batch, as
    ``linearize(model, x)`` builds it (same targets). A model whose output on the sample has no
    batch dimension of that size (it squeezes it) is checked on the whole batch instead.
    """
    if x.dim() == 0 or x.shape[0] <= samples or traces_its_input(model):
        return linearize(model, x)  # a traced chain serves inputs of the traced shape only
    outputs: list[Tensor] = []  # the model's output on the sample, which the check computes
    hook = model.register_forward_hook(lambda _module, _args, out: outputs.append(out))
    try:
        with _one_thread():
            checked = linearize(model, x[:samples])
    finally:
        hook.remove()
    out = outputs[-1] if outputs else None
    if not isinstance(out, Tensor) or out.dim() == 0 or out.shape[0] != samples:
        return linearize(model, x)
    whole = out[:1].expand(int(x.shape[0]), *out.shape[1:])  # the whole batch's, as a view
    return Chain(stages=[*checked.stages[:-1], ("loss", make_loss(whole, x))])


@contextmanager
def training_state(modules: list[nn.Module]) -> Iterator[None]:
    """Train mode during profiling; restore the training flags and buffers (BN statistics)."""
    flags = [(m, m.training) for module in modules for m in module.modules()]
    seen: set[int] = set()
    buffers = []
    for module in modules:
        for buffer in module.buffers():
            if id(buffer) not in seen:
                seen.add(id(buffer))
                buffers.append((buffer, buffer.detach().clone()))
    try:
        for module in modules:
            module.train()
        yield
    finally:
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)
        for m, training in flags:
            m.training = training


def profile_chain(
    chain: Chain,
    x: Tensor,
    *,
    repeats: int = 5,
    progress: ProgressCallback | None = None,
    gpu: GpuSpec | None = None,
    fake: bool = False,
    weight_grads: bool = False,
    dedupe: bool = True,
) -> list[Stage]:
    """Measure every stage of a chain, feeding each the previous one's output.

    With ``gpu``, the times are estimated for that GPU (:mod:`memplan.torch.estimate`) instead
    of measured, the sizes are measured as usual, and each stage's ``extra.estimate`` holds its
    operator counts. With ``fake`` too, the stages run on fake tensors (:mod:`memplan.torch.fake`):
    no computation, the same sizes, overheads without the kernels' own buffers.

    Parameters
    ----------
    chain : Chain
        The stages (last one the loss), on the device and in the data type of ``x``.
    x : Tensor
        The chain input x_0.
    repeats : int
        Timed iterations per stage.
    progress : callable, optional
        Called as ``progress(stage_name, done, total)`` after each stage.
    gpu : GpuSpec, optional
        Estimate the times for this GPU; ``repeats`` is then ignored.
    fake : bool
        With ``gpu``: run the stages on fake tensors (``FakeTensorMode``) instead of ``x``'s
        device.
    weight_grads : bool
        Also measure each stage's ``weight_grad_size`` and ``backward_overhead_fresh`` (a second
        instrumented iteration per measured stage). The gradient of a parameter shared by
        several stages is created by the last of them (the first to run its backward).
    dedupe : bool
        Measure identical stages once (:func:`memplan.torch.identical.stage_signature`): the
        later ones reuse the first one's figures (``extra.same_as`` names it) and only run a
        forward without autograd, for the next stage's input.

    Returns
    -------
    list of Stage
        The profile's stages, in forward order.
    """
    return _profile_stages(
        chain, x, repeats=repeats, progress=progress, gpu=gpu, fake=fake,
        weight_grads=weight_grads, dedupe=dedupe,
    ).stages  # fmt: skip


@dataclass
class _Profiled:
    stages: list[Stage]
    noise: Noise | None


def _last_users(chain: Chain) -> dict[int, int]:
    """Parameter id -> the last stage using it (whose backward, first to run, creates its
    gradient)."""
    last: dict[int, int] = {}
    for k, (_, module) in enumerate(chain.stages):
        for param in module.parameters():
            if param.requires_grad:
                last[id(param)] = k
    return last


def _gradient_bytes(module: nn.Module, creates: set[int], device: torch.device) -> int:
    """Bytes of the gradients of the parameters in ``creates`` (each as large as its parameter)."""
    params = {id(p): p for p in module.parameters() if id(p) in creates}
    return sum(allocation_bytes(p.numel() * p.element_size(), device) for p in params.values())


def _noise(summaries: list[tuple[str, Summary, float]], timed: bool) -> Noise | None:
    if not timed or not summaries:
        return None
    flagged = [name for name, summary, _ in summaries if summary.outliers]
    return Noise(
        spread=round(profile_noise([(summary, w) for _, summary, w in summaries]), 4),
        outliers=sum(summary.outliers for _, summary, _ in summaries),
        flagged=flagged or None,
    )


def _profile_stages(
    chain: Chain,
    x: Tensor,
    *,
    repeats: int,
    progress: ProgressCallback | None,
    gpu: GpuSpec | None,
    fake: bool,
    weight_grads: bool,
    dedupe: bool,
    selective: bool = False,
) -> _Profiled:
    probe: MemoryProbe = CudaProbe(x.device) if x.device.type == "cuda" else CpuProbe()
    stages: list[Stage] = []
    counted: set[int] = set()
    tf32 = tf32_flags()
    runner = None
    if fake and gpu is not None:
        from memplan.torch.fake import TensorLevelRun

        runner = TensorLevelRun()
        x = runner.fake(x)
    last_user = _last_users(chain)
    measured: dict[Any, tuple[str, StageMeasurement, dict[str, Any] | None]] = {}
    summaries: dict[str, tuple[str, Summary, float]] = {}
    with training_state(chain.modules), torch.enable_grad():
        for k, (name, module) in enumerate(chain.stages):
            params = [p for p in module.parameters() if id(p) not in counted]
            counted.update(id(p) for p in params)
            own = {id(p) for p in params}
            creates = {i for i, last in last_user.items() if last == k}
            key = None
            if dedupe and k < len(chain) - 1:
                key = stage_signature(module, x, input_grad=k > 0, counted=own, creates=creates)
            if key in measured:
                first, m, extra = measured[key]
                if runner is None:  # the next stage reads this stage's own output
                    with torch.no_grad():
                        output = module(x.clone()).detach()
                else:
                    output = m.output  # fake tensors: only the shape matters
                first_name, summary, weight = summaries[first]
                summaries[first] = (first_name, summary, weight + summary.median)
                extra = {**(extra or {}), "same_as": first}
            else:
                counter = None if gpu is None else OpCounter(tf32)
                policies = tuple(POLICIES) if selective and k < len(chain) - 1 else ()
                m = _measure_or_explain(
                    k, name, module, x, runner, repeats, probe, counter,
                    creates if weight_grads else None, policies,
                )  # fmt: skip
                output = m.output
                if weight_grads and m.weight_grad_size is None:  # fake tensors: by definition
                    m.weight_grad_size = _gradient_bytes(module, creates, x.device)
                extra = None
                if counter is not None and gpu is not None:
                    est = estimate_stage(counter, gpu)
                    m.forward_time, m.backward_time = est.forward_ms, est.backward_ms
                    extra = {"estimate": est.to_extra()}
                if key is not None:
                    measured[key] = (name, m, extra)
                summary = summarize(m.iteration_times)
                summaries[name] = (name, summary, summary.median)
            stages.append(
                Stage(
                    name=name,
                    forward_time=m.forward_time,
                    backward_time=m.backward_time,
                    output_size=m.output_size,
                    saved_size=m.saved_size,
                    forward_overhead=m.forward_overhead,
                    backward_overhead=m.backward_overhead,
                    weight_size=kept_bytes(module, params, x.device)
                    + (2 * m.output_size if k == len(chain) - 1 else 0),
                    grad_size=None if m.grad_size == m.output_size else m.grad_size,
                    weight_grad_size=m.weight_grad_size,
                    backward_overhead_fresh=m.backward_overhead_fresh,
                    forward_overhead_all=m.forward_overhead_all if weight_grads else None,
                    input_saved=m.input_saved if weight_grads else None,
                    output_saved=m.output_saved if weight_grads else None,
                    options=m.options,
                    extra=extra,
                )
            )
            x = output
            if progress is not None:
                progress(name, k + 1, len(chain))
    timed = gpu is None and runner is None and repeats >= 2  # one repeat has no spread
    return _Profiled(stages, _noise(list(summaries.values()), timed))


def _measure_or_explain(
    k: int,
    name: str,
    module: nn.Module,
    x: Tensor,
    runner: Any,
    repeats: int,
    probe: MemoryProbe,
    counter: OpCounter | None,
    creates: set[int] | None,
    policies: tuple[str, ...] = (),
) -> StageMeasurement:
    """:func:`measure_stage` (or the fake-tensor run's), a model's refusal as an input error."""
    try:
        if runner is not None:
            return runner.measure_stage(module, x, input_grad=k > 0, counter=counter)
        return measure_stage(
            module, x, input_grad=k > 0, repeats=repeats, probe=probe, counter=counter,
            creates_grads=creates, policies=policies,
        )  # fmt: skip
    except (RuntimeError, ValueError) as exc:
        stop = interrupt_within(exc)
        if stop is not None:  # Ctrl-C or a stop signal, wrapped by Python (__set_name__)
            raise stop from None
        # The model itself refuses these sizes in training mode (e.g. batch norm on a
        # single value per channel): a problem of the input, not of memplan.
        what = " ".join(str(exc).split())
        raise InputError(
            f"stage {k} ({name}) fails in training mode: {what}; "
            "try a larger --batch-size or --input-shape"
        ) from exc


def resolve_gpu(
    estimate: str | None, gpu_spec: str | Path | GpuSpec | Mapping[str, Any] | None
) -> tuple[GpuSpec | None, str | None]:
    """The GPU to estimate for, and its catalog key (None for a spec of one's own).

    Raises
    ------
    InputError
        Both given, an unknown GPU name (the catalog is listed) or a bad spec file.
    """
    if estimate is not None and gpu_spec is not None:
        raise InputError("--estimate and --gpu-spec: give one of them, not both")
    if estimate is not None:
        key = str(estimate).strip().lower()
        if key in gpu_catalog():
            return gpu_catalog()[key], key
        return load_gpu(estimate), None
    if gpu_spec is None:
        return None, None
    if isinstance(gpu_spec, GpuSpec):
        return gpu_spec, None
    if isinstance(gpu_spec, Mapping):
        return gpu_from_dict(gpu_spec), None
    return load_gpu_file(gpu_spec), None


def _module_label(model: nn.Module) -> str:
    """A module's name in its profile: its class name, lower case (``hf:`` + the model type for
    a Hugging Face model)."""
    from memplan.torch.hf import is_hf_model

    if is_hf_model(model):
        return f"hf:{model.config.model_type}"
    return type(model).__name__.lower()


def profile_model(
    model: str | nn.Module,
    *,
    example_input: Tensor | None = None,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    device: str = "auto",
    dtype: str = "float32",
    repeats: int = 5,
    progress: ProgressCallback | None = None,
    name: str | None = None,
    estimate: str | None = None,
    gpu_spec: str | Path | GpuSpec | Mapping[str, Any] | None = None,
    config: str | Mapping[str, Any] | None = None,
    threads: int | None = None,
    dedupe: bool = True,
    selective: bool = False,
    loss_chunks: int | None = None,
) -> Profile:
    """Profile a model for the chain algorithms: one stage per block, the loss last.

    With ``estimate`` (a GPU of :func:`memplan.gpu.gpu_catalog`) or ``gpu_spec`` (a GPU spec
    file, a :class:`~memplan.gpu.GpuSpec` or its dict), the times are estimated for that GPU from
    operator counts (docs/estimation.md) instead of measured: with ``device="auto"`` the model
    runs on fake tensors (no computation; the sizes of a CPU profile, overheads at the tensor
    level), the timed repetitions are skipped, ``device.kind`` is ``estimated`` and
    ``bandwidth`` the GPU's host link.

    Parameters
    ----------
    model : str or nn.Module
        A model name (``resnet50``, ``gpt-small``, see :data:`memplan.torch.models.MODELS`), a
        ``package.module:factory`` spec, or a module. A module is moved to ``device`` and
        ``dtype`` in place; its training flags and buffers are restored afterwards.
    example_input : Tensor, optional
        The chain input; built from ``batch_size`` and ``input_shape`` when omitted.
    batch_size : int, optional
        Samples per batch (default: 32 for images, the model's own for transformers).
    input_shape : tuple of int, optional
        Shape of one sample: ``(3, 224, 224)`` for images (default), ``(seq,)`` for transformers.
    device : str
        ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
    dtype : str
        ``float32``, ``bfloat16`` or ``float16``: weights and floating-point inputs.
    repeats : int
        Timed iterations per stage (median reported), after one warm-up iteration.
    progress : callable, optional
        ``progress(stage_name, done, total)``, called after each stage.
    name : str, optional
        The profile's ``model`` field (default: the model name, or the module's class name).
    estimate : str, optional
        Estimate the times for a GPU of the catalog (``a100``, ``h100``...). ``device="auto"``
        then runs the model on fake tensors (real CPU tensors when they cannot run it:
        ``measured.estimate.fake_failed`` says why); ``repeats`` is ignored.
    gpu_spec : str, Path, GpuSpec or dict, optional
        The same for a GPU described by a YAML/JSON file (or a spec). Give one of ``estimate``
        and ``gpu_spec``.
    config : str or dict, optional
        Config values of an ``hf:`` model, e.g. ``"n_layer=24,n_embd=1024"``
        (:func:`memplan.torch.hf.build_hf_model`).
    threads : int, optional
        torch's intra-op threads while measuring (restored afterwards). By default one thread
        on the CPU (:data:`CPU_THREADS`: steady times, and the CPU kernels' per-thread scratch
        memory of one thread) and the caller's count on CUDA. The count is recorded in
        ``measured.conditions``; ``memplan run`` trains on it.
    dedupe : bool
        Measure identical stages once (``profile_chain``).
    selective : bool
        Also measure every stage but the loss under each selective checkpointing policy
        (:data:`memplan.torch.selective.POLICIES`): the stages' ``options``, which rotor chooses
        from (docs/model.md, "Options of a stage"). Measured runs only (not estimates).
    loss_chunks : int, optional
        A language model's head and loss as one stage, ``head+loss``, computed in this many
        chunks of tokens (:mod:`memplan.torch.chunked_loss`): no step holds more than one
        chunk's logits. Recorded in ``measured.extra.loss_chunks``; the runtime follows it.

    Returns
    -------
    Profile
        A validated ``memplan-profile/1`` profile; sizes in bytes, times in ms.

    Raises
    ------
    InputError
        Unknown model, device, dtype or GPU, a bad shape or GPU spec, or a model that cannot be
        linearized.

    Examples
    --------
    >>> from memplan.torch import profile_model
    >>> prof = profile_model("resnet18", batch_size=2, input_shape=(3, 64, 64), repeats=1)
    >>> prof.stages[0].name, prof.stages[-1].name, prof.device.kind
    ('stem', 'loss', 'cpu')
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"--repeats {repeats!r}: expected a positive integer")
    if dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise InputError(f"--threads {threads!r}: expected a positive integer")
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if threads is None and (on_cpu or estimate is not None or gpu_spec is not None):
        threads = CPU_THREADS
    with intra_op_threads(threads):
        prof = _profile_model(
            model, example_input=example_input, batch_size=batch_size, input_shape=input_shape,
            device=device, dtype=dtype, repeats=repeats, progress=progress, name=name,
            estimate=estimate, gpu_spec=gpu_spec, config=config, dedupe=dedupe,
            selective=selective, loss_chunks=loss_chunks,
        )  # fmt: skip
        prof = _with_conditions(prof, dtype)
    if prof.device is not None and prof.device.kind == "cuda":
        workspace = library_workspace(resolve_device(device), DTYPES[dtype])
        prof = prof.model_copy(update={"workspace_size": workspace or None})
    return prof


def library_workspace(device: torch.device, dtype: torch.dtype) -> int:
    """Bytes the math libraries keep on ``device`` once a training step has run.

    cuBLAS allocates a workspace through PyTorch's allocator for every CPU thread that runs a
    matrix product, at its first one, and keeps it: one for the forward's thread and one for the
    backward's (autograd's device thread). They are in no stage's figures (a stage measured after
    the first product sees them already allocated) but in every step's peak: the profile records
    them as ``workspace_size``, static memory. Measured by releasing the workspaces (where this
    torch can) and running the forward and backward of a small linear layer in ``dtype``. 0 on a
    CPU.
    """
    if device.type != "cuda":
        return 0
    release = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    torch.cuda.synchronize(device)
    if release is not None:
        release()
    before = torch.cuda.memory_allocated(device)
    layer = nn.Linear(64, 64, device=device, dtype=dtype)
    x = torch.ones(8, 64, device=device, dtype=dtype, requires_grad=True)
    layer(x).sum().backward()
    del layer, x
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.memory_allocated(device) - before)


CPU_THREADS = 1
"""torch's intra-op threads :func:`profile_model` measures with on the CPU by default."""


def _with_conditions(prof: Profile, dtype: str) -> Profile:
    """``measured.conditions`` of a profile measured now (join profiles included)."""
    if prof.measured is None or prof.device is None:
        return prof
    kind = prof.device.kind
    where = torch.device("cuda" if kind == "cuda" else "cpu")
    conditions = current_conditions(where, dtype)
    measured = prof.measured.model_copy(update={"conditions": conditions})
    return prof.model_copy(update={"measured": measured})


def _profile_model(
    model: str | nn.Module,
    *,
    example_input: Tensor | None,
    batch_size: int | None,
    input_shape: tuple[int, ...] | None,
    device: str,
    dtype: str,
    repeats: int,
    progress: ProgressCallback | None,
    name: str | None,
    estimate: str | None,
    gpu_spec: str | Path | GpuSpec | Mapping[str, Any] | None,
    config: str | Mapping[str, Any] | None,
    dedupe: bool,
    selective: bool = False,
    loss_chunks: int | None = None,
) -> Profile:
    if isinstance(model, str):  # a join network: branches + turn, docs/profiling.md
        from memplan.torch.join import profile_join, resolve_join

        join = resolve_join(model, batch_size)
        if join is not None:
            if estimate is not None or gpu_spec is not None or input_shape is not None or config:
                raise InputError(
                    f"model {model!r} is a join network: --estimate, --gpu-spec, --config and "
                    "--input-shape do not apply (its factory gives the inputs)"
                )
            return profile_join(
                join, device=device, dtype=dtype, repeats=repeats, progress=progress, name=name
            )
    gpu, catalog_key = resolve_gpu(estimate, gpu_spec)
    fake = gpu is not None and device == "auto"  # an estimate on fake tensors: no computation
    if fake:
        device = "cpu"  # fake tensors stand for CPU tensors: CPU kernels' shapes and strides
    dev = resolve_device(device)
    torch_dtype = DTYPES[dtype]
    if isinstance(model, str):
        module, x, label = build_model(
            model, batch_size=batch_size, input_shape=input_shape, config=config
        )
        if example_input is not None:
            x = example_input
    elif config:
        raise InputError("config: only for an hf: model given by name")
    elif isinstance(model, nn.Module):
        module, label = model, _module_label(model)
        x = (
            example_input
            if example_input is not None
            else default_example_input(model, batch_size, input_shape)
        )
    else:
        raise InputError(f"model: expected a name or an nn.Module, got {type(model).__name__}")
    module.to(device=dev, dtype=torch_dtype)
    x = x.to(device=dev, dtype=torch_dtype) if x.is_floating_point() else x.to(device=dev)

    with model_errors(name or label, FIRST_FORWARD):  # the model's first run: NOTE [ whose error ]
        chain = chunk_loss(linearize_on_sample(module, x), x, loss_chunks, name or label)
    for _, stage in chain.stages:
        stage.to(device=dev)
    fake_failed = None
    common = {
        "progress": progress,
        "gpu": gpu,
        "dedupe": dedupe,
        "weight_grads": True,
        "selective": selective and gpu is None,
    }
    if fake:
        try:
            profiled = _profile_stages(chain, x, repeats=repeats, fake=True, **common)
        except Exception as exc:  # noqa: BLE001 - fake tensors fail where real ones may not
            fake = False
            fake_failed = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    if not fake:
        profiled = _profile_stages(chain, x, repeats=repeats, fake=False, **common)
    stages = profiled.stages

    threads = torch.get_num_threads()
    probe_method = CudaProbe.method if dev.type == "cuda" else CpuProbe.method
    extra: dict[str, Any] = {"threads": threads, "overheads": probe_method}
    if loss_chunks is not None:
        extra[LOSS_CHUNKS] = loss_chunks
    if gpu is None:
        device_block = describe_device(dev)
        largest = max([storage_bytes(x), *(s.saved_size for s in stages)])
        copied = None if dev.type == "cuda" else offload_copy_bytes(largest)
        bandwidth, extra["bandwidth"] = profile_bandwidth(dev, copied)
        estimated = None
    else:
        from memplan.torch.fake import OVERHEADS_METHOD

        device_block = Device(kind="estimated", name=gpu.name, memory=gpu.memory)
        bandwidth = gpu.host_bandwidth
        estimated = estimate_info(gpu, tf32_flags(), catalog_key)
        estimated["sizes_on"] = "fake" if fake else dev.type
        if fake:
            extra["overheads"] = OVERHEADS_METHOD
        if fake_failed is not None:
            estimated["fake_failed"] = fake_failed
    return Profile(
        model=name or label,
        batch_size=int(x.shape[0]) if x.dim() > 0 else None,
        input_shape=[int(d) for d in x.shape[1:]],
        dtype=dtype,
        device=device_block,
        bandwidth=bandwidth,
        measured=Measured(
            tool=f"memplan {memplan.__version__}",
            torch=torch.__version__,
            date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            repeats=repeats if gpu is None else 0,
            noise=profiled.noise,
            extra=extra,
            estimate=estimated,
        ),
        input_size=allocation_bytes(storage_bytes(x), dev),
        stages=stages,
    )
