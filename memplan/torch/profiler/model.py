"""Measure a model stage by stage and return a ``memplan-profile/1`` :class:`~memplan.Profile`.

The orchestration of the profiler: build the model (:mod:`memplan.torch.models.registry`), cut it
(:func:`memplan.torch.profiler.chain.linearize_on_sample`), profile its chain
(:mod:`memplan.torch.profiler.chain`) or its join network (:mod:`memplan.torch.profiler.join`),
and record the device, the bandwidth, the conditions and the noise. What each stage's figures
mean, and how they are measured: :mod:`memplan.torch.measure.stage`.

docs/profiling.md describes the method and its approximations; docs/estimation.md the estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import memplan
from memplan.errors import InputError
from memplan.gpu import GpuSpec, gpu_catalog, gpu_from_dict, load_gpu, load_gpu_file
from memplan.profile.model import Device, Measured, Profile
from memplan.torch.base.blame import FIRST_FORWARD, model_errors
from memplan.torch.base.device import describe_device, resolve_device
from memplan.torch.base.storage import storage_key, tensors_of
from memplan.torch.estimate.roofline import estimate_info, tf32_flags
from memplan.torch.measure.bandwidth import offload_copy_bytes, profile_bandwidth
from memplan.torch.measure.conditions import current_conditions, intra_op_threads
from memplan.torch.measure.fake import OVERHEADS_METHOD
from memplan.torch.measure.probe import (
    CpuProbe,
    CudaProbe,
    allocation_bytes,
)
from memplan.torch.measure.runner import (
    DTYPES,
    storage_bytes,
)
from memplan.torch.models.hf import is_hf_model
from memplan.torch.models.join import resolve_join
from memplan.torch.models.registry import build_model
from memplan.torch.models.registry import example_input as default_example_input
from memplan.torch.profiler.chain import ProgressCallback, linearize_on_sample, profile_stages
from memplan.torch.profiler.join import profile_join
from memplan.torch.profiler.unreached import unreached_bytes, unreached_tensors
from memplan.torch.split.chunked_loss import ChunkedLoss, chunk_loss, loss_chunks_extra
from memplan.torch.split.hf import hf_batch
from memplan.torch.split.wrappers import side_gradient_bytes

__all__ = [
    "CPU_THREADS",
    "library_workspace",
    "parameter_sizes",
    "profile_model",
    "resolve_gpu",
    "with_batch",
]


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
    a Hugging Face model).
    """
    if is_hf_model(model):
        return f"hf:{model.config.model_type}"
    return type(model).__name__.lower()


def profile_model(
    model: str | nn.Module,
    *,
    example_input: Tensor | Mapping[str, Any] | None = None,
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
        A model name (``resnet50``, ``gpt-small``, see :data:`memplan.torch.models.registry.MODELS`), a
        ``package.module:factory`` spec, or a module. A module is moved to ``device`` and
        ``dtype`` in place; its training flags and buffers are restored afterwards.
    example_input : Tensor or mapping, optional
        The chain input, or a Hugging Face batch (``input_ids`` or ``pixel_values``,
        ``labels``, an all-ones ``attention_mask``: :func:`memplan.torch.split.hf.hf_batch`; its
        labels are the loss stage's targets); built from ``batch_size`` and ``input_shape`` when
        omitted.
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
        (:func:`memplan.torch.models.hf.build_hf_model`).
    threads : int, optional
        torch's intra-op threads while measuring (restored afterwards). By default one thread
        on the CPU (:data:`CPU_THREADS`: steady times, and the CPU kernels' per-thread scratch
        memory of one thread) and the caller's count on CUDA. The count is recorded in
        ``measured.conditions``; ``memplan run`` trains on it.
    dedupe : bool
        Measure identical stages once (``profile_chain``).
    selective : bool
        Also measure every stage but the loss under each selective checkpointing policy
        (:data:`memplan.torch.runtime.selective.POLICIES`): the stages' ``options``, which rotor chooses
        from (docs/model.md, "Options of a stage"). Measured runs only (not estimates).
    loss_chunks : int, optional
        A language model's head and loss as one stage, ``head+loss``, computed in this many
        chunks of tokens (:mod:`memplan.torch.split.chunked_loss`): no step holds more than one
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
    labels = None
    batch = example_input
    if isinstance(example_input, Mapping):
        example_input, labels = hf_batch(example_input)
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if threads is None and (on_cpu or estimate is not None or gpu_spec is not None):
        threads = CPU_THREADS
    with intra_op_threads(threads):
        prof = _profile_model(
            model, example_input=example_input, batch_size=batch_size, input_shape=input_shape,
            device=device, dtype=dtype, repeats=repeats, progress=progress, name=name,
            estimate=estimate, gpu_spec=gpu_spec, config=config, dedupe=dedupe,
            selective=selective, loss_chunks=loss_chunks, labels=labels,
        )  # fmt: skip
        prof = with_batch(_with_conditions(prof, dtype), batch, example_input)
    if prof.device is not None and prof.device.kind == "cuda":
        workspace = library_workspace(resolve_device(device), DTYPES[dtype])
        prof = prof.model_copy(update={"workspace_size": workspace or None})
    return prof


def with_batch(prof: Profile, batch: Any, chain_input: Tensor | None) -> Profile:
    """``prof`` with the rest of a dict batch in its ``input_size``: the loop holds the whole
    batch through the step, and a profile measured on ``chain_input`` (and the labels its loss
    stage reads) holds none of the tensors the model turns into something else before its
    blocks: an attention mask, token type ids. Each storage once, as the allocator counts it on
    its device (1,024 bytes for the 2 x 64 mask of the sweep's tiny models, measured above every
    plan before). Anything but a dict: ``prof`` unchanged.
    """
    if not isinstance(batch, Mapping):
        return prof
    counted = [chain_input, batch.get("labels")]
    known = {key[0] for key in map(storage_key, tensors_of(counted)) if key is not None}
    rest: dict[int, tuple[int, torch.device]] = {}
    for tensor in tensors_of(list(batch.values())):
        key = storage_key(tensor)
        if key is not None and key[0] not in known:
            rest[key[0]] = (key[1], tensor.device)
    extra = sum(allocation_bytes(nbytes, device) for nbytes, device in rest.values())
    if not extra:
        return prof
    return prof.model_copy(update={"input_size": prof.input_size + extra})


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


def parameter_sizes(groups: list[list[nn.Parameter]], device: torch.device) -> list[int]:
    """The gradients of the trainable parameters of ``groups``, in order, 0 between two groups.

    Each distinct parameter once, as the allocator counts its gradient: the order a for-loop
    optimizer step goes through them (a profile's ``parameter_sizes``, docs/model.md).
    """
    sizes: list[int] = []
    seen: set[int] = set()
    for group in groups:
        if sizes and sizes[-1] != 0:
            sizes.append(0)
        for p in group:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                sizes.append(allocation_bytes(p.numel() * p.element_size(), device))
    return sizes[:-1] if sizes and sizes[-1] == 0 else sizes


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


def _move(module: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """``module`` to ``device``, and to ``dtype`` unless its parameters are in it already (a
    model's own buffers of another type stay as they are: Recurrent-Gemma's bfloat16 ones).
    """
    if any(p.is_floating_point() and p.dtype != dtype for p in module.parameters()):
        module.to(dtype=dtype)
    module.to(device=device)


def _release_lookups(chain: Any) -> None:
    """Give back the token lookups a chunked loss replaced to profile the chain (NOTE [ The tied
    gradient summed in place ] in :mod:`memplan.torch.split.tied_lookup`).
    """
    last = chain.modules[-1]
    if isinstance(last, ChunkedLoss):
        last.release()


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
    labels: Tensor | None = None,
) -> Profile:
    """:func:`profile_model`'s work once its arguments are checked.

    Long because: its split (the join network's case, the model built and moved to the device,
    the stages measured with fake tensors first, the device block of the profile) waits for the
    rework of memplan/torch/profiler/ on a parallel branch (issue 39 item 5 leaves it there).
    """
    join = resolve_join(model, batch_size) if isinstance(model, str) else None
    if join is not None:  # a join network: branches + turn, docs/profiling.md
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
    _move(module, dev, torch_dtype)
    x = x.to(device=dev, dtype=torch_dtype) if x.is_floating_point() else x.to(device=dev)

    with model_errors(name or label, FIRST_FORWARD):  # the model's first run: NOTE [ whose error ]
        cut = linearize_on_sample(module, x, labels=None if labels is None else labels.to(dev))
        chain = chunk_loss(cut, x, loss_chunks, name or label)
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
    try:
        if fake:
            try:
                profiled = profile_stages(chain, x, repeats=repeats, fake=True, **common)
            except Exception as exc:  # noqa: BLE001 - fake tensors fail where real ones may not
                fake = False
                fake_failed = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        if not fake:
            profiled = profile_stages(chain, x, repeats=repeats, fake=False, **common)
    finally:
        _release_lookups(chain)
    stages = profiled.stages
    # NOTE [ weights outside every stage ]: a tower the batch never reaches
    outside = unreached_tensors(module, [stage for _, stage in chain.stages])
    skipped = {id(t) for t in outside}

    threads = torch.get_num_threads()
    probe_method = CudaProbe.method if dev.type == "cuda" else CpuProbe.method
    extra: dict[str, Any] = {"threads": threads, "overheads": probe_method}
    extra.update(loss_chunks_extra(loss_chunks))
    if gpu is None:
        device_block = describe_device(dev)
        largest = max([storage_bytes(x), *(s.saved_size for s in stages)])
        copied = None if dev.type == "cuda" else offload_copy_bytes(largest)
        bandwidth, extra["bandwidth"] = profile_bandwidth(dev, copied)
        estimated = None
    else:
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
        parameter_sizes=parameter_sizes(
            [[p for p in module.parameters() if id(p) not in skipped]], dev
        ),
        unreached_weight_size=unreached_bytes(outside, dev) or None,
        side_gradient_size=side_gradient_bytes(chain.modules) or None,
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
