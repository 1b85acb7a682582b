"""Rich renderables for the human (``--format table``) output of every command.

Nothing here prints: each function returns a renderable that the command draws on stderr. Data
cells are :class:`rich.text.Text`, never markup, so names such as ``layer[3]`` show as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group, JustifyMethod
from rich.table import Table
from rich.text import Text

from memplan.units import format_size

OP_STYLES = {
    "F_all": "green",
    "F_ck": "cyan",
    "F_n": "yellow",
    "B": "magenta",
    "offload": "blue",
    "prefetch": "blue",
    "turn": "red",
}
OP_ORDER = ("F_all", "F_ck", "F_n", "B", "offload", "prefetch", "turn")


def _size(nbytes: int | float | None) -> str:
    if nbytes is None:
        return "-"
    return f"{format_size(nbytes)} ({int(nbytes)} bytes)"


def short_size(nbytes: int | float | None) -> str:
    """Three significant digits, for narrow columns: ``361K``, ``32.8M``, ``1.23G`` (10^3 units)."""
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("", "K", "M", "G", "T"):
        if abs(value) < 999.5 or unit == "T":
            if unit == "":
                return f"{value:.0f}"
            return f"{value:.3g}{unit}" if abs(value) >= 1 else f"{value:.2f}{unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def _key_values(title: str | None, rows: Iterable[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, box=None, title_justify="left", pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(Text(key), value if isinstance(value, Text) else Text(str(value)))
    return table


# --------------------------------------------------------------------------- solve


def op_counts(ops: Sequence[Any], stages: int) -> str:
    """``12 F_all, 3 F_ck, 5 F_n, 10 B; 8 forwards recomputed``."""
    counts: dict[str, int] = {}
    for op in ops:
        counts[op.op] = counts.get(op.op, 0) + 1
    parts = [f"{counts[name]} {name}" for name in OP_ORDER if name in counts]
    forwards = sum(counts.get(name, 0) for name in ("F_all", "F_ck", "F_n"))
    stages -= counts.get("turn", 0)  # join schedules: the turn is a stage, not a forward
    recomputed = max(0, forwards - stages) if forwards else 0
    text = ", ".join(parts) if parts else "no operations"
    return f"{text}; {recomputed} forward{'s' if recomputed != 1 else ''} recomputed"


def schedule_summary(schedule: Any, stages: int) -> Table:
    """Algorithm, status, makespan against the lower bound, peak against the budget, solver."""
    budget = schedule.budget.memory
    status = Text(schedule.solver.status, style="green" if schedule.feasible else "red bold")
    if not schedule.feasible:
        status.append(" (no plan fits the budget)", style="red")
    rows: list[tuple[str, Any]] = [
        ("algorithm", f"{schedule.algorithm} ({schedule.family})"),
        (
            "profile",
            f"{schedule.profile.model}, {stages} "
            f"{'nodes' if schedule.family == 'graph' else 'stages'}",
        ),
        ("status", status),
    ]
    rows += _time_rows(schedule)
    if schedule.peak_memory is not None:
        share = f", {schedule.peak_memory / budget * 100:.1f}% of the budget" if budget else ""
        rows.append(("peak memory", f"{_size(schedule.peak_memory)}{share}"))
    rows.append(("budget", _size(budget)))
    optimizer = schedule.budget.optimizer
    rows.append(
        (
            "static memory",
            _size(schedule.static_memory) + (f", optimizer {optimizer}" if optimizer else ""),
        )
    )
    if schedule.min_memory is not None:
        rows.append(("least memory that fits", _size(schedule.min_memory)))
    if schedule.budget.bandwidth is not None:
        rows.append(("bandwidth", f"{format_size(schedule.budget.bandwidth)}/s"))
    if schedule.budget.gpus is not None:
        rows.append(("gpus", str(schedule.budget.gpus)))
    solver = f"{schedule.solver.seconds:.3f} s"
    if schedule.solver.slots is not None:
        solver += f", {schedule.solver.slots} slots"
    rows.append(("solver", solver))
    if schedule.solver.message:
        rows.append(("note", schedule.solver.message))
    if schedule.family == "graph":
        rows += graph_rows(schedule)
    elif schedule.feasible and schedule.assignment is not None:
        rows.append(("assignment", " ".join(str(g) for g in schedule.assignment)))
        rows.append(("period", _ms(schedule.period)))
        rows.append(("throughput", f"{schedule.throughput:.1f} samples/s"))
        if schedule.gpu_memory:
            rows.append(("GPU peaks", ", ".join(format_size(p) for p in schedule.gpu_memory)))
    elif schedule.feasible:
        rows.append(("operations", op_counts(schedule.ops, stages)))
    return _key_values("Schedule", rows)


def _time_rows(schedule: Any) -> list[tuple[str, Any]]:
    """Makespan, lower bound and overhead; the graph family plans memory only (docs/graph.md)."""
    if schedule.family == "graph":
        return [("optimizes", GRAPH_OBJECTIVE)]
    rows: list[tuple[str, Any]] = []
    if schedule.feasible and schedule.makespan is not None:
        rows.append(("makespan", _ms(schedule.makespan)))
    rows.append(("lower bound", _ms(schedule.lower_bound)))
    if schedule.feasible and schedule.overhead is not None:
        rows.append(
            (
                "overhead",
                f"{schedule.overhead:.4f} x lower bound "
                f"(+{max(0.0, schedule.overhead - 1) * 100:.2f}%)",
            )
        )
    return rows


GRAPH_OBJECTIVE = "memory: the arena of an operator order and tensor addresses (no times)"


def graph_rows(schedule: Any) -> list[tuple[str, Any]]:
    """Graph-family figures: order, arena, peak resident, fragmentation (docs/graph.md)."""
    rows: list[tuple[str, Any]] = []
    if schedule.order is not None:
        rows.append(("order", f"{len(schedule.order)} nodes"))
    if schedule.arena is not None:
        rows.append(("arena", _size(schedule.arena)))
    if schedule.peak_resident is not None:
        rows.append(("peak resident", _size(schedule.peak_resident)))
    if schedule.fragmentation is not None:
        rows.append(("fragmentation", f"{schedule.fragmentation * 100:.2f}%"))
    if schedule.memory_bound is not None:
        rows.append(("solver bound", _size(schedule.memory_bound)))
    return rows


def stage_names(profile: Any) -> Sequence[str] | Mapping[tuple[int, int], str]:
    """Stage names for :func:`ops_table`: a list (chains), ``(branch, stage) -> name`` (joins)."""
    if profile.stages is not None:
        return [s.name for s in profile.stages]
    names: dict[tuple[int, int], str] = {}
    for j, branch in enumerate(profile.branches or []):
        for i, st in enumerate(branch.stages):
            names[(j, i)] = f"{branch.name}/{st.name}"
    if profile.turn is not None:
        names[(-1, 0)] = profile.turn.name
    return names


def ops_table(schedule: Any, stage_names: Sequence[str] | Mapping[tuple[int, int], str]) -> Table:
    """Every operation: index, op, branch (join schedules), stage (index and name), times."""
    transfers = any(op.stream != "compute" for op in schedule.ops)
    branches = any(getattr(op, "branch", None) is not None for op in schedule.ops)
    table = Table(title=f"Operations ({len(schedule.ops)})", title_justify="left")
    table.add_column("#", justify="right", style="dim", no_wrap=True)
    table.add_column("op", no_wrap=True)
    if branches:
        table.add_column("branch", justify="right", no_wrap=True)
    table.add_column("stage", justify="right", no_wrap=True)
    table.add_column("name", overflow="fold")  # the only column that wraps (NOTE [ table width ])
    table.add_column("start ms", justify="right", no_wrap=True)
    table.add_column("end ms", justify="right", no_wrap=True)
    table.add_column("duration ms", justify="right", no_wrap=True)
    if transfers:
        table.add_column("stream", no_wrap=True)
    for index, op in enumerate(schedule.ops):
        if isinstance(stage_names, Mapping):
            key = (-1 if op.branch is None else op.branch, op.stage)
            name = stage_names.get(key, "?")
        else:
            name = stage_names[op.stage] if 0 <= op.stage < len(stage_names) else "?"
        if op.stream == "transfer":
            name = f"{op.tensor or f's[{op.stage}]'} ({name})"
        row = [
            Text(str(index)),
            Text(op.op, style=OP_STYLES.get(op.op, "")),
            *((Text("-" if op.branch is None else str(op.branch)),) if branches else ()),
            Text(str(op.stage)),
            Text(name),
            Text(f"{op.start:.3f}"),
            Text(f"{op.end:.3f}"),
            Text(f"{op.end - op.start:.3f}"),
        ]
        if transfers:
            row.append(Text(op.stream))
        table.add_row(*row)
    return table


def pattern_table(schedule: Any, stage_names: Sequence[str]) -> Table:
    """A pipeline pattern: per GPU, its operations (start, end, shift) and the transfers."""
    table = Table(
        title=f"Pattern (period {schedule.period:.3f} ms, {schedule.throughput:.1f} samples/s)",
        title_justify="left",
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("where", "left"),
        ("op", "left"),
        ("stage", "right"),
        ("name", "left"),
        ("start ms", "right"),
        ("end ms", "right"),
        ("shift", "right"),
    )
    for name, justify in columns:  # only the stage name wraps (NOTE [ table width ] in common.py)
        table.add_column(name, justify=justify, no_wrap=name != "name", overflow="fold")
    for gp in schedule.pattern:
        for op in gp.ops:
            name = stage_names[op.stage] if 0 <= op.stage < len(stage_names) else "?"
            table.add_row(
                Text(f"GPU {gp.gpu}"),
                Text(op.op, style="green" if op.op == "F" else "magenta"),
                Text(str(op.stage)),
                Text(name),
                Text(f"{op.start:.3f}"),
                Text(f"{op.end:.3f}"),
                Text(str(op.shift)),
            )
    for tr in schedule.transfers or []:
        table.add_row(
            Text(f"link {tr.src}->{tr.dst}"),
            Text(f"{tr.tensor}[{tr.stage}]", style="blue"),
            Text(str(tr.stage)),
            Text(""),
            Text(f"{tr.start:.3f}"),
            Text(f"{tr.end:.3f}"),
            Text(str(tr.shift)),
        )
    return table


# --------------------------------------------------------------------------- simulate


def simulation_summary(doc: Mapping[str, Any]) -> Table:
    ok = doc["valid"] and doc["fits"]
    verdict = Text(
        "valid, fits the budget" if ok else "INVALID", style="green" if ok else "red bold"
    )
    if doc["valid"] and not doc["fits"]:
        verdict = Text("valid but over budget", style="red bold")
    rows: list[tuple[str, Any]] = [
        ("schedule", f"{doc['algorithm']} for {doc['model']}"),
        ("result", verdict),
        ("makespan", f"{_ms(doc['makespan'])} (schedule says {_ms(doc['claimed_makespan'])})"),
        (
            "peak memory",
            f"{_size(doc['peak_memory'])} (schedule says {_size(doc['claimed_peak_memory'])})",
        ),
        ("budget", _size(doc["budget"])),
    ]
    if doc.get("times_match") is False:
        rows.append(("times", "differ from the profile's (the note below)"))
    if doc.get("violation"):
        rows.append(("first violation", Text(doc["violation"], style="red")))
    return _key_values("Simulation", rows)


# --------------------------------------------------------------------------- compare


def compare_table(
    rows: Sequence[Any], algos: Sequence[str], budgets: Sequence[int], title: str
) -> Group:
    """One row per budget, one column per algorithm: makespan / lower bound, ``-`` if infeasible."""
    cells = {(r.memory, r.algorithm): r for r in rows}
    table = Table()
    table.add_column("budget", justify="right", no_wrap=True)
    for name in algos:
        table.add_column(name, justify="right", no_wrap=True)
    for memory in budgets:
        ratios = [cells[(memory, a)].ratio if (memory, a) in cells else None for a in algos]
        best = min((r for r in ratios if r is not None), default=None)
        line = [Text(format_size(memory))]
        for ratio in ratios:
            if ratio is None:
                line.append(Text("-", style="dim"))
            else:
                style = "bold green" if best is not None and ratio <= best * (1 + 1e-9) else ""
                line.append(Text(f"{ratio:.4f}", style=style))
        table.add_row(*line)
    note = Text("- : no plan of that algorithm fits the budget", style="dim")
    return Group(Text(title, style="italic"), table, note)


# --------------------------------------------------------------------------- info and algos


def _measured_rows(measured: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """How the profile was measured, one row per part (tool and date; each of ``conditions`` and
    ``noise`` on its own row, as ``key value`` pairs): no row holds a whole dict's repr.
    """
    plain = {k: v for k, v in measured.items() if k not in ("extra", "estimate")}
    nested = {k: plain.pop(k) for k in ("conditions", "noise") if isinstance(plain.get(k), Mapping)}
    rows: list[tuple[str, Any]] = []
    if plain:
        rows.append(("measured", ", ".join(f"{k} {v}" for k, v in plain.items())))
    for name, values in nested.items():
        parts = []
        for key, value in values.items():
            if isinstance(value, Mapping):
                value = " ".join(f"{k}={v}" for k, v in value.items())
            elif isinstance(value, (list, tuple)):
                value = " ".join(str(v) for v in value)
            parts.append(f"{key} {value}")
        rows.append((name, ", ".join(parts)))
    return rows


def _accounting(desc: Mapping[str, Any]) -> str:
    """``optimizer sgd, --gradients at-backward``: what the static memory and the least memory
    of every family count (docs/model.md).
    """
    loop = desc.get("gradients")
    return f"optimizer {desc['optimizer']}" + (f", --gradients {loop}" if loop else "")


def info_tables(desc: Mapping[str, Any]) -> Group:
    """The profile's header, totals and memory needs, then one row per stage."""
    stage_rows = desc.get("stage_table") or []
    estimates = [_stage_estimate(st) for st in stage_rows]
    header = _key_values("Profile", _profile_rows(desc, estimates))
    if not stage_rows:
        return Group(header)
    return Group(header, Text(""), _stage_table(stage_rows, estimates))


def _profile_rows(
    desc: Mapping[str, Any], estimates: list[Mapping[str, Any]]
) -> list[tuple[str, Any]]:
    """The header's rows: what the profile is, how it was measured, its totals and needs."""
    device = desc.get("device") or {}
    device_text = " ".join(str(device[k]) for k in ("kind", "name") if device.get(k)) or "-"
    if device.get("memory"):
        device_text += f", {format_size(device['memory'])}"
    measured = desc.get("measured") or {}
    rows: list[tuple[str, Any]] = [
        ("model", desc["model"]),
        ("nodes" if desc.get("kind") == "graph" else "stages", str(desc["stages"])),
        ("batch size", "-" if desc.get("batch_size") is None else str(desc["batch_size"])),
        (
            "input shape",
            "-" if not desc.get("input_shape") else "x".join(str(d) for d in desc["input_shape"]),
        ),
        ("dtype", desc.get("dtype") or "-"),
        ("device", device_text),
    ]
    if desc.get("bandwidth"):
        rows.append(("bandwidth", f"{format_size(desc['bandwidth'])}/s"))
    rows += _measured_rows(measured)
    if isinstance(measured.get("estimate"), Mapping) or any(estimates):
        rows += _estimate_rows(measured.get("estimate") or {}, estimates)
    rows += [
        ("input size", _size(desc.get("input_size"))),
        ("weights", _size(desc["weight_size"])),
        ("static memory", f"{_size(desc['static_memory'])} ({_accounting(desc)})"),
        ("lower bound", _ms(desc["lower_bound"])),
        ("store-all needs", _size(desc.get("store_all_memory"))),
    ]
    graph = desc.get("graph")
    if isinstance(graph, Mapping):
        rows += _graph_rows(graph)
    for family, value in (desc.get("min_memory") or {}).items():
        rows.append((f"least memory ({family})", _size(value)))
    for key, label in (("branches", "branches"), ("join_model", "join model")):
        if desc.get(key) is not None:
            rows.append((label, str(desc[key])))
    if desc.get("c_min") is not None:
        rows.append(("c_min (Theorem 2)", f"{desc['c_min']} slots of {_size(desc['slot_size'])}"))
    rows.append(("sha256", desc.get("sha256", "-")))
    return rows


def _graph_rows(graph: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A graph profile's rows: its nodes and tensors, and the framework's own placement."""
    kinds = ", ".join(f"{v} {k}" for k, v in (graph.get("kinds") or {}).items())
    return [
        (
            "graph",
            f"{graph['nodes']} nodes ({kinds}), {graph['tensors']} tensors, "
            f"{graph['control_edges']} control edges",
        ),
        ("persistent", _size(graph["persistent_bytes"])),
        ("framework peak resident", _size(graph["framework_peak_resident"])),
        (
            "framework arena",
            f"{_size(graph['framework_arena'])}, fragmentation "
            f"{graph['framework_fragmentation'] * 100:.2f}%",
        ),
        ("peak resident >=", _size(graph["peak_resident_lower_bound"])),
    ]


def _stage_table(stage_rows: list[Mapping[str, Any]], estimates: list[Mapping[str, Any]]) -> Table:
    """One row per stage: times, sizes, and the bound of each estimated time."""
    longest = max((len(str(st.get("name", ""))) for st in stage_rows), default=4)
    stages = Table(
        title="Stages (sizes in decimal units)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=any(estimates),  # room for the bound column in 80 columns
    )
    for name, justify in (
        ("#", "right"),
        ("name", "left"),
        ("fwd ms", "right"),
        ("bwd ms", "right"),
        ("output", "right"),
        ("saved", "right"),
        ("fwd tmp", "right"),
        ("bwd tmp", "right"),
        ("weights", "right"),
        *((("bound", "left"),) if any(estimates) else ()),
    ):
        if name == "name":
            stages.add_column(name, min_width=min(longest, 16), overflow="fold")
        else:
            stages.add_column(
                name, justify=justify, style="dim" if name == "#" else None, no_wrap=True
            )
    for index, st in enumerate(stage_rows):
        stages.add_row(
            Text(str(index)),
            Text(str(st.get("name", "?"))),
            Text(f"{st.get('forward_time', 0.0):.2f}"),
            Text(f"{st.get('backward_time', 0.0):.2f}"),
            Text(short_size(st.get("output_size"))),
            Text(short_size(st.get("saved_size"))),
            Text(short_size(st.get("forward_overhead", 0))),
            Text(short_size(st.get("backward_overhead", 0))),
            Text(short_size(st.get("weight_size", 0))),
            *((_bound_cell(estimates[index]),) if any(estimates) else ()),
        )
    return stages


def _stage_estimate(stage: Mapping[str, Any]) -> Mapping[str, Any]:
    """``extra.estimate`` of a stage of an estimated profile, else an empty mapping."""
    extra = stage.get("extra")
    estimate = extra.get("estimate") if isinstance(extra, Mapping) else None
    return estimate if isinstance(estimate, Mapping) else {}


def _bound_cell(estimate: Mapping[str, Any]) -> Text:
    bound = estimate.get("bound")
    if bound not in ("compute", "memory"):
        return Text("-", style="dim")
    return Text(str(bound), style="yellow" if bound == "compute" else "cyan")


def _estimate_rows(
    info: Mapping[str, Any], estimates: Sequence[Mapping[str, Any]]
) -> list[tuple[str, Any]]:
    """Header rows of an estimated profile: the GPU and model, totals, bound stages."""
    rows: list[tuple[str, Any]] = []
    gpu: Mapping[str, Any] = info["gpu"] if isinstance(info.get("gpu"), Mapping) else {}
    what = str(gpu.get("name") or "?")
    if info.get("catalog"):
        what += f" (catalog {info['catalog']})"
    details = [str(info.get("model", "?"))]
    tf32 = info.get("tf32")
    if isinstance(tf32, Mapping):
        on = [k for k in ("conv", "matmul") if tf32.get(k)]
        details.append(f"TF32 for {' and '.join(on)}" if on else "no TF32")
    rows.append(("estimated for", f"{what}; {', '.join(details)}"))

    def total(key: str) -> int:
        return sum(int(e.get(key) or 0) for e in estimates)

    if any(estimates):
        flops = total("forward_flops") + total("backward_flops")
        moved = total("forward_bytes") + total("backward_bytes")
        kernels = total("forward_kernels") + total("backward_kernels")
        rows.append(
            (
                "work (fwd + bwd)",
                f"{flops / 1e9:,.2f} GFLOP, {format_size(moved)} moved, {kernels} kernels",
            )
        )
        compute = sum(1 for e in estimates if e.get("bound") == "compute")
        memory = sum(1 for e in estimates if e.get("bound") == "memory")
        rows.append(("bound", f"{compute} stages compute-bound, {memory} memory-bound"))
    return rows


ALGOS_WIDTH = 80
"""``memplan algos`` fits this many columns (summaries are cut with an ellipsis)."""


def algos_table(entries: Sequence[Mapping[str, Any]]) -> Table:
    """One line per algorithm: name, family, exact or heuristic and its short summary, within 80
    columns (a summary longer than what is left is cut with an ellipsis; every bundled
    algorithm's short summary fits: tests/cli/test_width.py).
    """
    name_width = max((len(str(e.get("name", ""))) for e in entries), default=4)
    family_width = max((len(str(e.get("family", ""))) for e in entries), default=6)
    kind_width = len("heuristic")
    # a simple table with no edges: one space of padding each side of each of the four columns
    summary_width = ALGOS_WIDTH - (name_width + family_width + kind_width) - 2 * 4
    table = Table(
        title="Algorithms (memplan algos NAME: details and options)",
        title_justify="left",
        box=None,
        show_edge=False,
    )
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("family", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("summary", no_wrap=True, overflow="ellipsis", max_width=summary_width)
    for entry in entries:
        table.add_row(
            Text(str(entry.get("name", ""))),
            Text(str(entry.get("family", ""))),
            Text("exact" if entry.get("exact") else "heuristic"),
            Text(_cut(str(entry.get("short") or entry.get("summary", "")), summary_width)),
        )
    return table


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)].rstrip() + "…"


def algorithm_tables(details: Mapping[str, Any]) -> Group:
    """``memplan algos NAME``: the algorithm's entry, then its family's options."""
    about = Table(
        title=f"{details['name']} ({details['family']} family)",
        title_justify="left",
        show_header=False,
    )
    about.add_column("field", style="bold", no_wrap=True)
    about.add_column("value")
    rows = [
        ("kind", "exact" if details.get("exact") else "heuristic"),
        ("summary", details.get("summary", "")),
        ("needs", details.get("needs", "")),
        ("profile", details.get("profile", "")),
        ("reference", details.get("reference", "")),
    ]
    for field, value in rows:
        about.add_row(field, Text(str(value)))
    options = Table(title=f"Options of the {details['family']} family", title_justify="left")
    options.add_column("option", no_wrap=True)
    options.add_column("meaning, default, accepted values, commands")
    for spec in details.get("options", []):
        text = Text(str(spec["help"]))
        text.append(
            f"\ndefault: {spec['default']}; accepts: {spec['accepts']}; "
            f"in: {', '.join(spec['commands'])}",
            style="dim",
        )
        options.add_row(Text(f"{spec['option']} {spec['metavar']}"), text)
    if not details.get("options"):
        return Group(about, Text("The family declares no options.", style="dim"))
    return Group(about, options)
