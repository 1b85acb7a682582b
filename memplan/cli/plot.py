"""The ``compare --plot`` figure: makespan / lower bound against the memory budget.

Drawn in the style of Figure 5 of Beaumont, Eyraud-Dubois & Shilova (Euro-Par 2020,
Optimal GPU-CPU Offloading Strategies (Euro-Par 2020)): x the memory budget in GB, y the ratio of each algorithm's makespan to the lower
bound, one curve per algorithm. matplotlib (the ``plot`` extra) is imported only here, with the Agg
backend, and the file is written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memplan.errors import InputError
from memplan.views.plot import memory_unit, save_figure_atomic

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def check_plot_target(path: Path) -> None:
    """Fail before any work when the suffix is not drawable or matplotlib is missing."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--plot {path}: expected a .png, .svg or .pdf file name")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            "--plot needs matplotlib: install memplan[plot] (pip install 'memplan[plot]')"
        ) from None


def plot_sweep(path: Path, rows: Sequence[Any], algos: Sequence[str], title: str = "") -> None:
    """Draw one curve per algorithm; infeasible budgets leave a gap."""
    check_plot_target(path)
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    budgets = sorted({r.memory for r in rows})
    unit, scale = memory_unit(max(budgets, default=0))
    figure = Figure(figsize=(6.4, 4.2), layout="constrained")
    axes = figure.add_subplot()
    for index, name in enumerate(algos):
        points = sorted((r.memory, r.ratio) for r in rows if r.algorithm == name)
        xs = [m / scale for m, _ in points]
        ys = [float("nan") if ratio is None else ratio for _, ratio in points]
        # Curves often coincide (every algorithm reaches 1.0 with enough memory): the earlier ones
        # are drawn wider, under the later ones, so that each stays visible.
        wider = len(algos) - 1 - index
        axes.plot(
            xs,
            ys,
            marker=MARKERS[index % len(MARKERS)],
            markersize=4 + 1.5 * wider,
            linewidth=1.3 + 0.9 * wider,
            label=name,
        )
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    if budgets and budgets[0] < budgets[-1]:
        margin = (budgets[-1] - budgets[0]) / scale * 0.03
        axes.set_xlim(budgets[0] / scale - margin, budgets[-1] / scale + margin)
    axes.set_xlabel(f"Memory budget ({unit})")
    axes.set_ylabel("Makespan / lower bound")
    if title:
        axes.set_title(title)
    axes.grid(True, linewidth=0.4, alpha=0.6)
    axes.legend(frameon=False)
    save_figure_atomic(figure, path)
