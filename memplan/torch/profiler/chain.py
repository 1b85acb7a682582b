"""Profile a chain of stages: each stage measured (or estimated) on the previous one's output.

:func:`profile_chain` feeds every stage of a :class:`~memplan.torch.split.linearize.Chain` the
output of the one before and measures it with :func:`memplan.torch.measure.stage.measure_stage`
(or on fake tensors, :mod:`memplan.torch.measure.fake`), measuring identical stages once
(:mod:`memplan.torch.profiler.identical`); :func:`linearize_on_sample` cuts the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.gpu import GpuSpec
from memplan.interrupt import interrupt_within
from memplan.profile.model import Noise, Stage
from memplan.torch.base.blame import raised_by_model
from memplan.torch.base.storage import storage_key
from memplan.torch.estimate.roofline import OpCounter, estimate_stage, tf32_flags
from memplan.torch.measure.fake import TensorLevelRun
from memplan.torch.measure.probe import (
    CpuProbe,
    CudaProbe,
    MemoryProbe,
    allocation_bytes,
)
from memplan.torch.measure.runner import (
    StageMeasurement,
    kept_bytes,
    new_buffers,
)
from memplan.torch.measure.stage import measure_stage
from memplan.torch.measure.tied import shared_parameters
from memplan.torch.measure.timing import Summary, profile_noise, summarize
from memplan.torch.profiler.identical import stage_signature
from memplan.torch.runtime.selective import POLICIES
from memplan.torch.split.linearize import Chain, linearize, make_loss, traces_its_input
from memplan.torch.split.stages import train_mode

ProgressCallback = Callable[[str, int, int], None]


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


def linearize_on_sample(
    model: nn.Module,
    x: Tensor,
    samples: int = LINEARIZE_SAMPLES,
    labels: Tensor | None = None,
) -> Chain:
    """:func:`~memplan.torch.split.linearize.linearize`, checked on the first ``samples`` samples only.

    The check (the chain reproduces the model's output, in eval mode) is about the model's
    structure, not its batch size: running it on the whole batch costs two forwards, more than
    half a training iteration, for nothing more. Chains found by tracing the model (Hugging Face
    models, the generic repeated-block cut: :func:`~memplan.torch.split.linearize.traces_its_input`) are
    built on the whole batch, their stages being tied to the traced shapes. The loss stage is
    built for the whole batch, as
    ``linearize(model, x)`` builds it (same targets). A model whose output on the sample has no
    batch dimension of that size (it squeezes it) is checked on the whole batch instead, and so
    is one given ``labels`` (a Hugging Face batch's: the loss stage's targets).
    """
    if x.dim() == 0 or x.shape[0] <= samples or traces_its_input(model) or labels is not None:
        return linearize(model, x, labels=labels)  # a traced chain: inputs of its shape only
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
    with train_mode(*modules):
        yield


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

    With ``gpu``, the times are estimated for that GPU (:mod:`memplan.torch.estimate.roofline`) instead
    of measured, the sizes are measured as usual, and each stage's ``extra.estimate`` holds its
    operator counts. With ``fake`` too, the stages run on fake tensors (:mod:`memplan.torch.measure.fake`):
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
        Measure identical stages once (:func:`memplan.torch.profiler.identical.stage_signature`): the
        later ones reuse the first one's figures (``extra.same_as`` names it) and only run a
        forward without autograd, for the next stage's input.

    Returns
    -------
    list of Stage
        The profile's stages, in forward order.
    """
    return profile_stages(
        chain, x, repeats=repeats, progress=progress, gpu=gpu, fake=fake,
        weight_grads=weight_grads, dedupe=dedupe,
    ).stages  # fmt: skip


@dataclass
class ProfiledStages:
    stages: list[Stage]
    noise: Noise | None


def _last_users(chain: Chain) -> dict[int, int]:
    """Parameter id -> the last stage using it (whose backward, first to run, creates its
    gradient).
    """
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


def _first_use_gradients(params: list[nn.Parameter], device: torch.device) -> tuple[int, int]:
    """Bytes of the gradients of ``params`` (the trainable ones), and the largest of them."""
    sizes = [
        allocation_bytes(p.numel() * p.element_size(), device) for p in params if p.requires_grad
    ]
    return sum(sizes), max(sizes, default=0)


def _noise(summaries: list[tuple[str, Summary, float]], timed: bool) -> Noise | None:
    if not timed or not summaries:
        return None
    flagged = [name for name, summary, _ in summaries if summary.outliers]
    return Noise(
        spread=round(profile_noise([(summary, w) for _, summary, w in summaries]), 4),
        outliers=sum(summary.outliers for _, summary, _ in summaries),
        flagged=flagged or None,
    )


def _without_side(module: nn.Module, buffers: list[Tensor]) -> list[Tensor]:
    """The buffers a stage counts in its ``weight_size``: not the side inputs with a gradient
    it holds (:attr:`~memplan.torch.split.wrappers.BlockCall.side_pointers`), which the
    profile counts once for the chain (``side_gradient_size``).
    """
    side = getattr(module, "side_pointers", frozenset())
    return [b for b in buffers if (storage_key(b) or (None,))[0] not in side]


def profile_stages(
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
) -> ProfiledStages:
    """Measure (or estimate) every stage of ``chain`` in turn, each on its predecessor's output.

    Long because: its split (a stage identical to one measured before, a stage measured, the
    record of a stage) waits for the rework of memplan/torch/profiler/ on a parallel branch
    (issue 39 item 5 leaves it there).
    """
    probe: MemoryProbe = CudaProbe(x.device) if x.device.type == "cuda" else CpuProbe()
    stages: list[Stage] = []
    counted: set[int] = set()
    counted_buffers: set[int] = set()  # storage pointers
    tf32 = tf32_flags()
    runner = None
    if fake and gpu is not None:
        runner = TensorLevelRun()
        x = runner.fake(x)
    last_user = _last_users(chain)
    summed: dict[int, tuple[set[int], int]] = {}  # NOTE [ a gradient a later stage made ]
    in_place: set[int] = set()
    measured: dict[Any, tuple[str, StageMeasurement, dict[str, Any] | None]] = {}
    summaries: dict[str, tuple[str, Summary, float]] = {}
    with training_state(chain.modules), torch.enable_grad():
        for k, (name, module) in enumerate(chain.stages):
            params = [p for p in module.parameters() if id(p) not in counted]
            counted.update(id(p) for p in params)
            own = {id(p) for p in params}
            buffers = new_buffers(module, counted_buffers)
            creates = {i for i, last in last_user.items() if last == k}
            # the gradients this stage completes (it uses their parameters first): what the
            # optimizer step in the backward steps and frees at the end of its backward
            first_use, largest = _first_use_gradients(params, x.device)
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
                tied = creates - own  # its gradients an earlier stage's is added into
                m = _measure_or_explain(
                    k, name, module, x, runner, repeats, probe, counter,
                    creates if weight_grads else None, policies, tied if weight_grads else None,
                )  # fmt: skip
                output = m.output
                if weight_grads and m.weight_grad_size is None:  # fake tensors: by definition
                    m.weight_grad_size = _gradient_bytes(module, creates, x.device)
                elif weight_grads and getattr(module, "side_gradient_bytes", 0):
                    # NOTE [ A side input with a gradient ]: its parameters' gradients come
                    # through the blocks' backward, which the stage's own does not run
                    every = _gradient_bytes(module, creates, x.device)
                    m.weight_grad_size = max(m.weight_grad_size or 0, every)
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
                    weight_size=kept_bytes(params, _without_side(module, buffers), x.device)
                    + (2 * m.output_size if k == len(chain) - 1 else 0)
                    + m.made_leaf_size,  # NOTE [ a leaf the forward makes ]
                    grad_size=None if m.grad_size == m.output_size else m.grad_size,
                    weight_grad_size=m.weight_grad_size,
                    first_use_grad_size=first_use if weight_grads else None,
                    largest_grad_size=largest if weight_grads else None,
                    backward_overhead_fresh=m.backward_overhead_fresh,
                    forward_overhead_all=m.forward_overhead_all if weight_grads else None,
                    input_saved=m.input_saved if weight_grads else None,
                    output_saved=m.output_saved if weight_grads else None,
                    options=m.options,
                    extra=extra,
                )
            )
            in_place |= m.sums_in_place
            if m.backward_overhead_summed is not None:
                summed[k] = (
                    {id(p) for p in shared_parameters(module, creates)},
                    m.backward_overhead_summed,
                )
            x = output
            if progress is not None:
                progress(name, k + 1, len(chain))
    for k, (shared, overhead) in summed.items():  # summed out of place where autograd does
        if not shared <= in_place:
            stages[k] = stages[k].model_copy(update={"backward_overhead_fresh": overhead})
    timed = gpu is None and runner is None and repeats >= 2  # one repeat has no spread
    return ProfiledStages(stages, _noise(list(summaries.values()), timed))


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
    tied: set[int] | None = None,
) -> StageMeasurement:
    """:func:`measure_stage` (or the fake-tensor run's), a model's refusal as an input error."""
    try:
        if runner is not None:
            return runner.measure_stage(module, x, input_grad=k > 0, counter=counter)
        return measure_stage(
            module, x, input_grad=k > 0, repeats=repeats, probe=probe, counter=counter,
            creates_grads=creates, policies=policies, tied=tied or (),
        )  # fmt: skip
    except InputError as exc:  # a stage memplan's terms cannot count
        raise InputError(f"stage {k} ({name}): {exc}") from None
    except (RuntimeError, ValueError) as exc:
        stop = interrupt_within(exc)
        if stop is not None:  # Ctrl-C or a stop signal, wrapped by Python (__set_name__)
            raise stop from None
        if not raised_by_model(exc, through_module_call=False):
            raise  # a line of memplan's own: a bug (NOTE [ whose error ])
        # The model itself refuses to train on this input (e.g. batch norm on a single value
        # per channel: then a larger batch is the way out): a problem of the input.
        what = " ".join(str(exc).split())
        advice = (
            "try a larger --batch-size or --input-shape"
            if _too_small(what)
            else ("the model does not train on this input in training mode")
        )
        raise InputError(f"stage {k} ({name}) fails in training mode: {what}; {advice}") from exc


def _too_small(message: str) -> bool:
    """Whether a model's error in training mode says that the batch or the input is too small."""
    return any(
        words in message
        for words in ("more than 1 value per channel", "Kernel size can't be greater", "too small")
    )
