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
    runtime's recomputation context (:func:`memplan.torch.runtime.recompute.recomputing`): with autograd
    (the peak beyond ``saved_size``, as ``F_all`` runs) and without (the peak beyond the output,
    as ``F_ck``/``F_n`` run); the larger counts. The backward's peak beyond the gradient of the
    input, measured with the weight gradients already allocated (the per-operator weight
    gradient is a temporary added into them). Clamped at 0.
``weight_size``
    What the stage keeps between iterations: its parameters (a parameter shared by stages counts
    in the first one), its buffers, 4 bytes per parameter tensor (Adam's step count), for
    the loss stage the loss and its gradient (:func:`kept_bytes`, docs/runtime.md), and a
    tensor the forward makes that requires a gradient, with its gradient (``made_leaf_size``:
    NOTE [ a leaf the forward makes ]).
``bandwidth`` (of the profile)
    The host<->device copy rate (:mod:`memplan.torch.measure.bandwidth`): pinned copies on CUDA, the
    runtime's own offload copy on CPU.

On CUDA every size is rounded up to the caching allocator's 512-byte blocks
(:func:`memplan.torch.measure.probe.allocation_bytes`).

The chain is checked against the model on one sample (:func:`linearize_on_sample`).

With ``estimate=GPU`` (or ``gpu_spec=FILE``) the times are estimated for that GPU from
per-operator FLOP and byte counts (:mod:`memplan.torch.estimate.roofline`) and the timed iterations are
skipped; with ``device="auto"`` the stages run on fake tensors (:mod:`memplan.torch.measure.fake`): the
same sizes as on CPU without computing anything.

docs/profiling.md describes the method and its approximations; docs/estimation.md the estimate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from memplan.profile.model import StageOption
from memplan.torch.base.autograd import graph_nodes
from memplan.torch.base.storage import storage_key
from memplan.torch.estimate.roofline import OpCounter
from memplan.torch.measure.probe import (
    CpuProbe,
    CudaProbe,
    MemoryProbe,
    allocation_bytes,
)
from memplan.torch.measure.runner import (
    LONG_ITERATION_S,
    LONG_REPEATS,
    StageMeasurement,
    StageRunner,
    clear_grads,
    median_ms,
    static_pointers,
    storage_bytes,
)
from memplan.torch.measure.tied import (
    backward_owning,
    prepare_shared,
    shared_parameters,
    sum_out_of_place,
    sums_in_place,
)
from memplan.torch.runtime.recompute import recomputing
from memplan.torch.runtime.selective import cached_storages, contexts


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
    made_leaf_size: int


def _instrumented(runner: StageRunner, probe: MemoryProbe, static: Collection[int]) -> _Sizes:
    """One iteration under the memory probe and ``saved_tensors_hooks``, as the runtime runs it.

    The forward runs twice, both times inside :func:`memplan.torch.runtime.recompute.recomputing` (the
    copies of the buffers and the RNG state a recomputation holds count): without autograd, as
    ``F_ck``/``F_n`` run, and with it, as ``F_all`` runs; the forward overhead covers both. The
    backward runs with the weight gradients already allocated (zeros), as in a training loop that
    keeps them from one iteration to the next: the gradient each operator computes is a temporary
    added into them.

    Returns
    -------
    _Sizes
        Sizes as the allocator counts them (:func:`memplan.torch.measure.probe.allocation_bytes`);
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
    made = _made_leaves(out, runner.module, leaf)

    backward_overhead = 0
    grad = runner.output_gradient(out)
    if grad is not None:
        _allocate_grads(runner.module, lambda _param: True)
        runner.sync()
        backward_peak = probe.peak(lambda: out.backward(grad), dict)
        input_grad_size = storage_bytes(None if leaf is None else leaf.grad)
        backward_overhead = max(
            0,
            backward_peak
            - allocation_bytes(input_grad_size, device)
            - _held_bytes(_gradients(made), excluded, device),
        )
        clear_grads(runner.module)
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
        made_leaf_size=_held_bytes(made + _gradients(made), excluded, device),
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
    runner: StageRunner, probe: MemoryProbe, creates: Collection[int]
) -> tuple[int, int, int | None, set[int]]:
    """A forward (as ``F_all`` runs) and a backward measured as PyTorch's default loop runs it:
    the gradients of the parameters in ``creates`` (ids) are None before it, so that the backward
    creates them; the stage's other parameters (shared with a later stage, whose backward comes
    first and creates their gradients) have theirs already. Where there are such parameters, a
    second run with their gradients summed out of place (NOTE [ a gradient a later stage made ]
    in :mod:`memplan.torch.measure.tied`).

    Returns
    -------
    (int, int, int or None)
        ``(weight_grad_size, backward_overhead_fresh, summed)``: the bytes of the gradients
        created; the peak beyond them and the input gradient, relative to the backward's start
        (what the forward saved included), negative when the backward frees saved tensors before
        it has created every gradient (the sum of the two is the peak, neither short of it nor
        above); the same with the shared gradients summed out of place (None without shared
        parameters).
    """
    shared = shared_parameters(runner.module, creates)
    weight_grads, fresh = _fresh_run(runner, probe, creates, summed=False)
    summed = _fresh_run(runner, probe, creates, summed=True)[1] if shared else None
    return weight_grads, fresh, summed


def _fresh_run(
    runner: StageRunner, probe: MemoryProbe, creates: Collection[int], summed: bool
) -> tuple[int, int]:
    """One run of :func:`_fresh_backward`: the shared gradients in ``.grad`` beforehand, or
    (``summed``) added out of place as autograd's input buffer adds them, the output's gradient
    autograd's alone.
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
    made = _made_leaves(out, runner.module, leaf)
    grad = runner.output_gradient(out)
    if grad is None:
        return 0, 0
    handles: list[Any] = []
    if summed:
        handles = sum_out_of_place(shared_parameters(runner.module, creates), probe)
    else:
        _allocate_grads(runner.module, lambda param: id(param) not in creates)
        prepare_shared(shared_parameters(runner.module, creates))
    # NOTE [ The backward owns what it frees ]: in the model's graph, nobody but autograd holds
    # the output's gradient g[k+1] (its first node consumes it) nor, once the next stage's
    # backward has run, the output x[k+1] (a stage ending in a ReLU saved it: its node frees
    # it). Held here until the backward returns, both were counted to its end: RegNet's first
    # block 131,072 bytes above plain training's peak. The gradient is made under the probe,
    # whose events then see it freed, and handed to autograd alone; the output let go.
    box: list[Tensor] = []
    del grad
    probe.peak(lambda made=out: box.append(torch.ones_like(made)), dict)
    step = backward_owning(out, box)
    del out
    runner.sync()
    try:
        peak = probe.peak(step, dict)
    finally:
        for handle in handles:
            handle.remove()
    created: dict[int, int] = {}
    for param in runner.module.parameters():
        key = None if id(param) not in creates or param.grad is None else storage_key(param.grad)
        if key is not None:
            created[key[0]] = allocation_bytes(key[1], device)
    input_grad_size = allocation_bytes(storage_bytes(None if leaf is None else leaf.grad), device)
    weight_grads = sum(created.values())
    clear_grads(runner.module)
    made_grads = _held_bytes(_gradients(made), (), device)  # the profile's weight_size holds them
    return weight_grads, peak - input_grad_size - weight_grads - made_grads


def _made_leaves(out: Tensor, module: nn.Module, given: Tensor | None) -> list[Tensor]:
    """The tensors a stage's forward makes that require a gradient of their own.

    NOTE [ a leaf the forward makes ]
    A leaf of ``out``'s graph that is neither a parameter nor the stage's input ``given`` (MRA's
    attention without its CUDA kernel returns ``torch.zeros_like(query).requires_grad_()``).
    Autograd's ``AccumulateGrad`` node for it holds it, and the backward accumulates its
    gradient into its ``.grad``: the tensor lives from the stage's forward, its gradient from
    the stage's backward, as long as the step's graph, until the loop lets go of the loss (after
    the optimizer's step), whether a node saved the tensor or not. The runtime runs the model's
    own forward once, with autograd, whatever the plan (NOTE [ Planned iteration ] in
    :mod:`memplan.torch.runtime.iteration`): the leaf of that forward is the one held, under
    ``F_all`` as under ``F_ck``; a recomputation makes a leaf of its own, which its throwaway
    graph drops when it returns (or the stage's saved tensors keep, as any other), and the
    gradient goes to the first forward's leaf. The profile counts both for the whole step in the
    stage's ``weight_size`` (:func:`_held_bytes`), memory the step holds whatever the schedule:
    the planner, the simulator and the oracles count it as the weights, with no rule of its
    own. An upper bound: before the stage's forward (backward) the tensor (gradient) does not
    exist yet. A loop that keeps the loss or the output into the next step keeps the previous
    step's leaves and gradients through the next forward, where the new leaves come on top: one
    tensor per leaf beyond the count until the loop lets go of the previous loss.
    """
    parameters = {id(p) for p in module.parameters()}
    found: list[Tensor] = []
    for node in graph_nodes(out.grad_fn):
        variable = getattr(node, "variable", None)  # an AccumulateGrad node
        if isinstance(variable, Tensor) and not (
            isinstance(variable, nn.Parameter) or id(variable) in parameters or given is variable
        ):
            found.append(variable)
    return found


def _gradients(leaves: Sequence[Tensor]) -> list[Tensor]:
    """The gradients the backward accumulated into ``leaves``."""
    return [leaf.grad for leaf in leaves if leaf.grad is not None]


def _held_bytes(tensors: Sequence[Tensor], excluded: Collection[int], device: torch.device) -> int:
    """Bytes of ``tensors`` (leaves a stage's forward made, their gradients), each storage once,
    less those in ``excluded`` (parameters, buffers, the stage's input): the stage's
    ``weight_size`` holds them (NOTE [ a leaf the forward makes ]), its backward's overhead not.
    """
    storages: dict[Any, int] = {}
    for tensor in tensors:
        key = storage_key(tensor)
        if key is None:  # a fake tensor: its own bytes
            storages[id(tensor)] = tensor.numel() * tensor.element_size()
        elif key[0] not in excluded:
            storages[key[0]] = key[1]
    return sum(allocation_bytes(nbytes, device) for nbytes in storages.values())


def measure_option(
    runner: StageRunner, probe: MemoryProbe, static: Collection[int], policy: str, repeats: int
) -> StageOption:
    """One stage run as an ``F_all`` under a selective policy (:mod:`memplan.torch.runtime.selective`),
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
        saved = _cache_and_output_bytes(forward, out, (inp, leaf), static, device)
        made = _made_leaves(out, runner.module, leaf)
        grad = runner.output_gradient(out)

        def backward() -> None:
            _recompute_then_backward(runner, inp, recompute, slots, static, out, grad)

        if grad is None:
            return 0.0
        runner.sync()
        if measure:
            backward_peak = probe.peak(backward, dict)
            input_grad = storage_bytes(None if leaf is None else leaf.grad)
            sizes["saved"] = saved
            sizes["forward"] = max(0, peak - saved)
            made_grads = _held_bytes(_gradients(made), static, device)  # in weight_size
            sizes["backward"] = max(
                0, backward_peak - allocation_bytes(input_grad, device) - made_grads
            )
            clear_grads(runner.module)
            return 0.0
        start = time.perf_counter()
        backward()
        runner.sync()
        return time.perf_counter() - start

    iteration(measure=False)  # warm-up
    iteration(measure=True)
    times = [iteration(measure=False) for _ in range(max(1, repeats))]
    clear_grads(runner.module)
    return StageOption(
        name=policy,
        saved_size=sizes.get("saved", 0),
        forward_overhead=sizes.get("forward", 0),
        backward_overhead=sizes.get("backward", 0),
        backward_time=median_ms(times),
    )


def _cache_and_output_bytes(
    forward: Any,
    out: Tensor,
    inputs: tuple[Any, ...],
    static: Collection[int],
    device: torch.device,
) -> int:
    """What a selective forward keeps: the storages of its SAC cache and its output (allocator
    sizes), the ``static`` ones and the ``inputs``' left out.
    """
    excluded = set(static) | {k[0] for k in map(storage_key, inputs) if k is not None}
    cached = {
        ptr: allocation_bytes(s.nbytes(), device)
        for ptr, s in cached_storages(forward).items()
        if ptr not in excluded
    }
    out_key = storage_key(out)
    output_size = 0 if out_key is None else allocation_bytes(out_key[1], device)
    return sum(cached.values()) + (output_size if out_key and out_key[0] not in cached else 0)


def _recompute_then_backward(
    runner: StageRunner,
    inp: Tensor,
    recompute: Any,
    slots: list[_OptionSlot],
    static: Collection[int],
    out: Tensor,
    grad: Tensor | None,
) -> None:
    """The backward of a selective ``F_all`` as the runtime runs it: the forward again under the
    recomputation context, whose saved tensors fill the forward's ``slots``, then the backward.
    """
    packed: list[Tensor] = []

    def pack(tensor: Tensor) -> None:
        packed.append(tensor.detach())

    fresh = inp.detach().requires_grad_(inp.requires_grad)
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, _same)
    with recomputing(runner.module, None, runner.x.device), hooks, recompute:
        runner.forward(fresh)
    kept = [t for t in packed if (storage_key(t) or (0,))[0] not in static]
    if len(kept) != len(slots):
        raise RuntimeError(f"its recomputation saved {len(kept)} tensors, its forward {len(slots)}")
    for slot, tensor in zip(slots, kept, strict=True):
        slot.value = tensor
    slots.clear()
    packed.clear()
    kept.clear()
    if grad is not None:
        out.backward(grad)


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
    static: Collection[int] | None = None,
    counter: OpCounter | None = None,
    creates_grads: Collection[int] | None = None,
    policies: Sequence[str] = (),
    tied: Collection[int] = (),
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
        (:mod:`memplan.torch.estimate.roofline`); ``repeats`` is then ignored.
    creates_grads : collection of int, optional
        Ids of the parameters whose gradients this stage's backward creates in a loop that sets
        them to None before each iteration (its own, less those shared with a later stage):
        measures ``weight_grad_size`` and ``backward_overhead_fresh``. Not measured when omitted.
    policies : sequence of str
        Selective checkpointing policies (:data:`memplan.torch.runtime.selective.POLICIES`) to measure
        the stage's ``F_all`` under (:func:`measure_option`): its ``options``, in that order.
    tied : collection of int
        Ids of the parameters whose gradient this stage makes that an earlier stage uses too:
        whether autograd adds the earlier stage's gradient into it in place (``sums_in_place``,
        NOTE [ a gradient a later stage made ] in :mod:`memplan.torch.measure.tied`).

    Returns
    -------
    StageMeasurement
        With ``output`` the (detached) stage output, the next stage's input.
    """
    if probe is None:
        probe = CudaProbe(x.device) if x.device.type == "cuda" else CpuProbe()
    static = static_pointers(module) if static is None else static
    runner = StageRunner(module, x, input_grad)
    # warm-up: allocator caches, lazy initialisation, kernel selection (and the operator counts)
    warm_forward, warm_backward, output = runner.timed(counter)
    sizes = _instrumented(runner, probe, static)
    weight_grads = fresh = summed = None
    if creates_grads is not None:
        weight_grads, fresh, summed = _fresh_backward(runner, probe, set(creates_grads))
    in_place = sums_in_place(runner, [p for p in module.parameters() if id(p) in tied])
    forward_times, backward_times = [0.0], [0.0]
    if counter is None:
        forward_times, backward_times = [], []
        if warm_forward + warm_backward >= LONG_ITERATION_S:
            repeats = min(repeats, LONG_REPEATS)
        for _ in range(max(1, repeats)):
            forward, backward, output = runner.timed()
            forward_times.append(forward)
            backward_times.append(backward)
    clear_grads(module)
    options = None
    if policies and counter is None:
        options = [measure_option(runner, probe, static, p, repeats) for p in policies]
        # An option recomputes what the stage saves: its backward is never faster than the
        # stage's own (a faster measure is noise, which rotor would take for a gain).
        backward = median_ms(backward_times)
        options = [
            o.model_copy(update={"backward_time": max(o.backward_time, backward)}) for o in options
        ]
    return StageMeasurement(
        options=options,
        forward_time=median_ms(forward_times),
        backward_time=median_ms(backward_times),
        output_size=sizes.output_size,
        grad_size=sizes.grad_size,
        saved_size=sizes.saved_size,
        forward_overhead=sizes.forward_overhead,
        backward_overhead=sizes.backward_overhead,
        output=output,
        weight_grad_size=weight_grads,
        backward_overhead_fresh=fresh,
        backward_overhead_summed=summed,
        sums_in_place=in_place,
        forward_overhead_all=sizes.forward_overhead_all,
        input_saved=sizes.input_saved,
        output_saved=sizes.output_saved,
        made_leaf_size=sizes.made_leaf_size,
        iteration_times=[f + b for f, b in zip(forward_times, backward_times, strict=True)],
    )
