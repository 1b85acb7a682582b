"""``memplan profile``: measure a model stage by stage and write a ``memplan-profile/1`` YAML."""

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from memplan.cli.common import echo_err, err_console, guard, write_output
from memplan.cli.model_options import (
    LOSS_CHUNKS_HELP,
    TORCH_HINT,
    ConfigOption,
    DeviceChoice,
    DType,
    ModelArgument,
    check_counts,
    has_torch,
    parse_config_option,
    parse_shape,
)
from memplan.errors import InputError, did_you_mean

if TYPE_CHECKING:
    from memplan.gpu import GpuSpec
    from memplan.profile.model import Profile

GPU_NAMES = "v100, v100-32gb, a100, a100-80gb, h100, l4, rtx4090"
"""The catalog's GPUs, for --help (tests/test_gpu.py checks it against the catalog)."""
DEFAULT_REPEATS = 5
"""The profiler's timed repetitions per stage (``profile_model(repeats=...)``), for --help."""


def _check_gpu(
    estimate: str | None, gpu_spec: Path | None, repeats: int | None
) -> "str | GpuSpec | None":
    """Validate --estimate / --gpu-spec before any model is built (no torch import).

    Returns what to pass to the profiler: the catalog name or a validated GpuSpec, or None.
    """
    from memplan.gpu import gpu_catalog, load_gpu_file

    if estimate is None and gpu_spec is None:
        return None
    if estimate is not None and gpu_spec is not None:
        raise InputError("--estimate and --gpu-spec: give one of them, not both")
    if repeats is not None:
        option = "--estimate" if estimate is not None else "--gpu-spec"
        raise InputError(f"--repeats: nothing is timed with {option} (leave --repeats out)")
    if estimate is not None:
        key = estimate.strip().lower()
        if key not in gpu_catalog():
            raise InputError(
                f"--estimate {estimate!r}: unknown GPU{did_you_mean(key, gpu_catalog())}; the "
                f"catalog has: {', '.join(gpu_catalog())} (or describe yours with --gpu-spec FILE)"
            )
        return key
    assert gpu_spec is not None  # one of the two, checked above
    try:
        return load_gpu_file(gpu_spec)
    except InputError as exc:
        raise InputError(f"--gpu-spec {exc}") from None


# The options of memplan profile (those of every command that builds a model: model_options.py).
BatchSizeOption = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        "-b",
        metavar="N",
        help="Batch size.  [default: 32 for images, the model's own for transformers]",
    ),
]
InputShapeOption = Annotated[
    str | None,
    typer.Option(
        metavar="C,H,W",
        help="Shape of one sample, e.g. 3,224,224.  [default: the model's: 3,224,224 "
        "(3,299,299 for inception_v3), the sequence length for transformers]",
    ),
]
DeviceOption = Annotated[
    DeviceChoice, typer.Option(help="Where to measure; auto picks cuda when available.")
]
DataTypeOption = Annotated[DType, typer.Option(help="Data type of the activations and weights.")]
RepeatsOption = Annotated[
    int | None,
    typer.Option(metavar="N", help=f"Timed repetitions per stage.  [default: {DEFAULT_REPEATS}]"),
]
GraphOption = Annotated[
    bool,
    typer.Option(
        "--graph",
        help="Capture the whole training step (forward, backward, SGD step) as an "
        "operator-level graph for the graph family instead (fake tensors: sizes only).",
    ),
]
EstimateOption = Annotated[
    str | None,
    typer.Option(
        metavar="GPU",
        help=f"Estimate the times for a GPU of the catalog instead of measuring them: {GPU_NAMES}.",
    ),
]
GpuSpecFileOption = Annotated[
    Path | None,
    typer.Option(
        "--gpu-spec",
        metavar="FILE",
        help="Estimate the times for the GPU described in FILE (YAML; see "
        "docs/estimation.md). Not together with --estimate.",
    ),
]
OutputOption = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        help="Write the YAML to FILE atomically instead of stdout.",
    ),
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="torch's intra-op threads while measuring (recorded in the profile; memplan "
        "run trains on them).  [default: 1 on the CPU, torch's own on CUDA]",
    ),
]
SelectiveOption = Annotated[
    bool,
    typer.Option(
        "--selective",
        help="Also measure every stage but the loss under memplan's selective checkpointing "
        "policies: the stages' options, which rotor chooses from.",
    ),
]
LossChunksOption = Annotated[
    int | None, typer.Option("--loss-chunks", metavar="N", help=LOSS_CHUNKS_HELP)
]


def profile(
    model: ModelArgument,
    batch_size: BatchSizeOption = None,
    input_shape: InputShapeOption = None,
    device: DeviceOption = DeviceChoice.auto,
    dtype: DataTypeOption = DType.float32,
    repeats: RepeatsOption = None,
    graph: GraphOption = False,
    estimate: EstimateOption = None,
    gpu_spec: GpuSpecFileOption = None,
    output: OutputOption = None,
    config: ConfigOption = None,
    threads: ThreadsOption = None,
    selective: SelectiveOption = False,
    loss_chunks: LossChunksOption = None,
) -> None:
    """Profile a PyTorch model and write its profile (YAML) to stdout or -o FILE.

    Progress goes to stderr, so the output composes:
    memplan profile resnet18 | memplan solve --algo rotor --mem 2GB
    """
    with guard():
        check_counts(
            ("--batch-size", batch_size),
            ("--repeats", repeats),
            ("--threads", threads),
            ("--loss-chunks", loss_chunks),
        )
        gpu = _check_gpu(estimate, gpu_spec, repeats)
        shape = None if input_shape is None else parse_shape(input_shape)
        config_values = parse_config_option(model, config)
        if not has_torch():
            raise InputError(f"memplan profile {TORCH_HINT}")
        if graph:
            _check_graph_options(config_values, threads, selective, loss_chunks)
            _profile_graph(model, batch_size, shape, dtype.value, device, gpu, repeats, output)
            return
        from memplan.profile import save_profile
        from memplan.torch.profiler.model import profile_model

        given = {"batch_size": batch_size, "input_shape": shape, "repeats": repeats}
        given["threads"] = threads
        given["loss_chunks"] = loss_chunks
        kwargs: dict[str, object] = {"device": device.value, "dtype": dtype.value}
        kwargs.update({name: value for name, value in given.items() if value is not None})
        if selective:
            if gpu is not None:
                raise InputError("--selective: measured profiles only (not with --estimate)")
            kwargs["selective"] = True
        if gpu is not None:
            kwargs["estimate" if estimate is not None else "gpu_spec"] = gpu
        label = f"profiling {model}"
        if gpu is not None:
            label += f" (times estimated for {estimate or gpu_spec})"
        start = "building the model and checking its chain of stages"
        if config_values:
            kwargs["config"] = config_values
        result = run_with_progress(profile_model, model, kwargs, label, start)
        write_output(save_profile(result), output)
        echo_err(_profiled_line(result, device))


def _check_graph_options(
    config: str | None, threads: int | None, selective: bool, loss_chunks: int | None
) -> None:
    """``--graph``: the options of a measured chain profile are usage errors."""
    if config:
        raise InputError("--config: not with --graph")
    if threads is not None:
        raise InputError("--threads: not with --graph (nothing is computed)")
    if selective:
        raise InputError("--selective: not with --graph (chain profiles only)")
    if loss_chunks is not None:
        raise InputError("--loss-chunks: not with --graph (chain profiles only)")


def _profiled_line(result: "Profile", device: DeviceChoice) -> str:
    """``memplan: profiled resnet18: 11 stages on cpu, lower bound ... ms; 1 thread, ...``."""
    where = result.device.kind if result.device else device.value
    if result.device is not None and result.device.kind == "estimated":
        info = (result.measured.estimate if result.measured else None) or {}
        sizes_on = info.get("sizes_on", "cpu")
        sizes_on = "fake tensors" if sizes_on == "fake" else sizes_on
        where = f"{sizes_on}, times estimated for {result.device.name}"
    return (
        f"memplan: profiled {result.model}: {result.length} stages on {where}, "
        f"lower bound {result.lower_bound:.3f} ms{_measurement_note(result)}"
    )


def _measurement_note(prof: "Profile") -> str:
    """``; 1 thread, 6 of 19 stages reused, timing noise 3.1% (2 outliers: layer3.1)``."""
    parts = []
    conditions = prof.measured.conditions if prof.measured else None
    if conditions is not None and conditions.threads and prof.device and prof.device.kind == "cpu":
        parts.append(f"{conditions.threads} thread{'s' if conditions.threads > 1 else ''}")
    stages = prof.all_stages()
    reused = sum(1 for s in stages if s.extra and "same_as" in s.extra)
    if reused:
        parts.append(f"{reused} of {len(stages)} stages identical to one measured before")
    noise = prof.measured.noise if prof.measured else None
    if noise is not None:
        text = f"timing noise {100 * noise.spread:.1f}%"
        if noise.outliers:
            text += f" ({noise.outliers} outlier repeat{'s' if noise.outliers > 1 else ''}"
            text += f": {', '.join(noise.flagged or [])})"
        parts.append(text)
    return "; " + ", ".join(parts) if parts else ""


def _profile_graph(
    model: str,
    batch_size: int | None,
    shape: tuple[int, ...] | None,
    dtype: str,
    device: DeviceChoice,
    gpu: object,
    repeats: int | None,
    output: Path | None,
) -> None:
    """``--graph``: capture the training step's operator graph (fake tensors, sizes only)."""
    if gpu is not None or repeats is not None:
        raise InputError(
            "--graph: the graph is captured with fake tensors and not timed "
            "(leave out --estimate, --gpu-spec and --repeats)"
        )
    if device == DeviceChoice.cuda:
        raise InputError(
            "--graph: captured on the CPU with fake tensors (sizes do not depend "
            "on the device); leave out --device cuda"
        )
    from memplan.profile import save_profile
    from memplan.torch.profiler.graph import profile_graph

    console = err_console()
    status = console.status(f"capturing the training graph of {model}", spinner="dots")
    with status if console.is_terminal else nullcontext():
        result = profile_graph(model, batch_size=batch_size, input_shape=shape, dtype=dtype)
    write_output(save_profile(result), output)
    graph = result.graph
    echo_err(
        f"memplan: captured {result.model}: {len(graph.nodes)} nodes, "
        f"{sum(1 for t in graph.tensors if t.size > 0)} tensors (graph only, sizes from fake "
        "tensors, times 0)"
    )


def run_with_progress(
    profile_model: Callable[..., "Profile"],
    model: object,
    kwargs: dict[str, object],
    label: str,
    start: str | None = None,
) -> "Profile":
    """``profile_model`` with a bar on a terminal, one line per stage on stderr otherwise
    (``start``: a first line, before the model is built).
    """
    from memplan.cli.progress import Progress

    with Progress(label) as progress:
        if start is not None:
            progress.note(start)

        def on_progress(stage_name: str, done: int, total: int) -> None:
            progress.update(done, total, stage_name)

        return profile_model(model, progress=on_progress, **kwargs)
