"""Draw a schedule: memory over time with the budget line, and the operations beneath.

The top panel is the simulator's ``memory_curve`` (static memory included) against the budget;
the bottom panel a Gantt-like strip per stream (compute, transfer), one bar per operation,
coloured by kind (``F_all``, ``F_ck``, ``F_n``, ``B``, ``offload``, ``prefetch``). matplotlib (the
``plot`` extra) is imported only when drawing, with the Agg backend; the file is written
atomically (temporary file, ``os.replace``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memplan.errors import InputError
from memplan.profile.model import Profile
from memplan.schedule import Schedule

__all__ = ["OP_COLORS", "plot_schedule"]

OP_COLORS = {
    "F_all": "#1f77b4",
    "F_ck": "#9ecae1",
    "F_n": "#c6dbef",
    "B": "#d62728",
    "offload": "#2ca02c",
    "prefetch": "#ff7f0e",
}
"""Bar colour of each operation kind."""

SUFFIXES = (".png", ".svg", ".pdf")


def memory_unit(largest: float) -> tuple[str, float]:
    """GB as in the papers' figures; a smaller decimal unit for toy profiles."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if largest >= scale:
            return unit, scale
    return "bytes", 1.0


def plot_schedule(
    path: str | os.PathLike[str],
    schedule: Schedule,
    profile: Profile,
    memory_curve: Sequence[tuple[float, int]],
    *,
    title: str | None = None,
) -> None:
    """Draw memory over time and the operations of ``schedule`` to ``path`` (.png/.svg/.pdf).

    Parameters
    ----------
    path : path
        Output file; its suffix gives the format.
    schedule : Schedule
        A feasible schedule.
    profile : Profile
        Its profile (stage names).
    memory_curve : sequence of (ms, bytes)
        ``memplan.simulate(profile, schedule).memory_curve``.
    title : str, optional
        Figure title (default: algorithm, model, budget, makespan).

    Raises
    ------
    InputError
        Unknown suffix, matplotlib missing, or the file cannot be written.
    """
    target = Path(path)
    if target.suffix.lower() not in SUFFIXES:
        raise InputError(f"-o {target}: expected a .png, .svg or .pdf file name")
    try:
        import matplotlib
    except ImportError:
        raise InputError(
            "plot needs matplotlib: install memplan[plot] (pip install 'memplan[plot]')"
        ) from None
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    names = [s.name for s in profile.stages] if profile.stages is not None else []
    budget = schedule.budget.memory
    peak = max([b for _, b in memory_curve] + [budget or 0, 1])
    unit, scale = memory_unit(peak)
    figure = Figure(figsize=(10, 5.2), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    _draw_memory(top, schedule, memory_curve, peak, unit, scale)
    top.set_title(_default_title(schedule, unit, scale) if title is None else title, fontsize=10)
    _draw_operations(bottom, schedule, names)
    save_figure_atomic(figure, target)


def _draw_memory(
    top: Any,
    schedule: Schedule,
    memory_curve: Sequence[tuple[float, int]],
    peak: int,
    unit: str,
    scale: float,
) -> None:
    """The top panel: the simulated memory, the budget and the static memory."""
    budget = schedule.budget.memory
    xs = [t for t, _ in memory_curve]
    ys = [b / scale for _, b in memory_curve]
    # The curve's points are levels that hold until the next point (a peak during an operation,
    # then what remains after it): a step function, not a line between points.
    top.plot(
        xs, ys, color="#333333", linewidth=1.2, drawstyle="steps-post", label="memory (simulated)"
    )
    top.fill_between(xs, ys, step="post", color="#999999", alpha=0.25, linewidth=0)
    if budget is not None:
        top.axhline(budget / scale, color="#d62728", linestyle="--", linewidth=1.0, label="budget")
    if schedule.static_memory:
        top.axhline(
            schedule.static_memory / scale,
            color="#777777",
            linestyle=":",
            linewidth=0.9,
            label="static memory",
        )
    top.set_ylabel(f"Memory ({unit})")
    top.set_ylim(0, peak / scale * 1.08)
    top.grid(True, linewidth=0.4, alpha=0.6)
    top.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)


def _default_title(schedule: Schedule, unit: str, scale: float) -> str:
    """``rotor plan of resnet50 at 4 GB, makespan 123.4 ms`` (the bandwidth when it transfers)."""
    budget = schedule.budget.memory
    makespan = f", makespan {schedule.makespan:.1f} ms" if schedule.makespan else ""
    mem = f" at {budget / scale:.3g} {unit}" if budget is not None else ""
    rate = schedule.budget.bandwidth
    mem += (
        f", {rate / 1e9:.3g} GB/s"
        if rate and any(o.stream == "transfer" for o in schedule.ops)
        else ""
    )
    return f"{schedule.algorithm} plan of {schedule.profile.model}{mem}{makespan}"


def _draw_operations(bottom: Any, schedule: Schedule, names: list[str]) -> None:
    """The bottom panel: a bar per operation on its stream's row, coloured by kind."""
    from matplotlib.patches import Patch

    streams = ["compute"] + (
        ["transfer"] if any(o.stream == "transfer" for o in schedule.ops) else []
    )
    rows = {stream: len(streams) - 1 - i for i, stream in enumerate(streams)}
    for op in schedule.ops:
        row = rows[op.stream]
        bottom.broken_barh(
            [(op.start, max(op.end - op.start, 0.0))],
            (row - 0.4, 0.8),
            facecolors=OP_COLORS.get(op.op, "#bbbbbb"),
            edgecolors="white",
            linewidth=0.3,
        )
        if op.end - op.start > 0:
            # Compute bars carry the stage index, transfer bars the tensor they move.
            label = str(op.stage) if op.stream == "compute" else op.tensor or f"s[{op.stage}]"
            bottom.text(
                (op.start + op.end) / 2,
                row,
                label,
                ha="center",
                va="center",
                fontsize=5,
                clip_on=True,
            )
    bottom.set_yticks([rows[s] for s in streams], streams)
    bottom.set_ylim(-0.6, len(streams) - 0.4)
    bottom.set_xlabel("Time (ms)")
    kinds = [k for k in OP_COLORS if any(o.op == k for o in schedule.ops)]
    bottom.legend(
        handles=[Patch(facecolor=OP_COLORS[k], label=k) for k in kinds],
        ncol=len(kinds) or 1,
        frameon=False,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.45),
    )
    bottom.set_title(
        f"operations (stage index on compute bars, tensor on transfer bars; {len(names)} "
        f"stages: {names[0]} .. {names[-1]})"
        if names
        else "operations",
        fontsize=8,
    )


def save_figure_atomic(figure: Any, path: Path) -> None:
    """Save a matplotlib figure to ``path`` atomically (NOTE [ safe writes ] in memplan.files)."""
    import io

    from memplan.files import write_atomic

    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.suffix.lower().lstrip("."), dpi=150)
    try:
        write_atomic(path, buffer.getvalue())
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None
