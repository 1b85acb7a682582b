"""Join networks (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A 2020): the paper's Figures 7 and 9, the SNN timing, heterogeneous gaps.

Usage::

    python benchmarks/bench_join.py            # everything; markdown on stdout, PNGs in docs/
    python benchmarks/bench_join.py timing fig7 fig9 gap profiles

Sections
--------
timing    SNN with L = 10 (three branches of 20, u_f = u_b = u_t = 1): ``memplan.solve`` with
          ``--algo join`` for every c from c_min = 7 to 6L + 3 = 63 (each call builds its own DP
          table and is replayed by the simulator), and the single table that holds every c.
fig7      Makespan / Span* against c / C_Opt for SNN (2L,2L,2L), CM (L,5L), RNN (6L), L = 5, 15.
fig9      EQUIV-CHAIN / Opt on SNN against the branch length 2L + 1, c = 9, 12, 15.
gap       Heterogeneous joins (chain model): the DP against the exhaustive search of
          tests/oracles/join.py on random small instances, every budget.
profiles  The bundled join profiles: join and equiv-chain from the least memory to store-all.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import memplan  # noqa: E402
from benchmarks._common import machine  # noqa: E402
from memplan.algorithms.join.pebble import JoinTable, c_min, equiv_chain_plans, plan_cost, plan_peak  # noqa: E402  # noqa: E402
from memplan.profile.synthetic import homogeneous_join, random_join  # noqa: E402

DOCS = ROOT / "docs"


def timing() -> None:
    L = 10
    lengths = [2 * L] * 3
    prof = homogeneous_join(lengths, size=1)
    started = time.perf_counter()
    values = []
    for c in range(c_min(lengths), 6 * L + 4):
        sched = memplan.solve(prof, "join", c, optimizer="none")
        values.append(sched.makespan)
    each = time.perf_counter() - started
    started = time.perf_counter()
    table = JoinTable(lengths, 6 * L + 3)
    one = time.perf_counter() - started
    assert values == [table.opt(c) for c in range(7, 6 * L + 4)]
    print("### SNN L = 10: every c from c_min to 6L + 3\n")
    print(f"- {len(values)} budgets (c = 7 .. 63), `memplan.solve(..., 'join')` each, replayed by "
          f"the simulator: **{each:.2f} s** in total")  # fmt: skip
    print(f"- one `JoinTable((20, 20, 20), 63)` holding every c: {one:.3f} s")
    print(f"- makespans: c = 7: {values[0]:g}, c = 9: {values[2]:g}, c = 31: {values[24]:g}, "
          f"c = 63: {values[-1]:g} (Span* = 12L + 1 = {12 * L + 1})\n")  # fmt: skip


MODELS = {
    "SNN (2L,2L,2L)": lambda L: (2 * L, 2 * L, 2 * L),
    "CM (L,5L)": lambda L: (L, 5 * L),
    "RNN (6L)": lambda L: (6 * L,),
}


def fig7() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    print("### Figure 7: makespan / Span* against c / C_Opt\n")
    for ax, L in zip(axes, (5, 15), strict=True):
        span = 12 * L + 1
        rows = {}
        for label, shape in MODELS.items():
            lengths = shape(L)
            top = sum(lengths) + len(lengths)
            table = JoinTable(lengths, top)
            cs = list(range(c_min(lengths), top + 1))
            ratios = [table.opt(c) / span for c in cs]
            line = ax.plot([c / top for c in cs], ratios, marker=".", label=label)[0]
            literal = JoinTable(lengths, top, convention="checkpoints")
            other = [literal.opt(c) / span for c in cs]
            ax.plot([c / top for c in cs], other, ls="--", color=line.get_color(), alpha=0.6)
            rows[label] = (
                top,
                dict(zip(cs, ratios, strict=True)),
                dict(zip(cs, other, strict=True)),
            )
        ax.set_title(f"L = {L}")
        ax.set_ylim(0.95, 3.05)  # the RNN at c_min (3 slots) is off the scale: see the table
        ax.set_xlabel("c / C_Opt")
        ax.grid(alpha=0.3)
        print(f"L = {L} (Span* = {span}); ratio at c_min, c_min + 2, c = C_Opt/2, C_Opt:\n")
        print("| model | C_Opt | c_min | at c_min | at c_min + 2 | at C_Opt/2 | at C_Opt | "
              "checkpoints reading: at c_min, c_min + 2, C_Opt/2 |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for label, (top, ratio, other) in rows.items():
            lo = min(ratio)
            half = round(top / 2)
            print(f"| {label} | {top} | {lo} | {ratio[lo]:.3f} | {ratio[lo + 2]:.3f} | "
                  f"{ratio[half]:.3f} | {ratio[top]:.3f} | "
                  f"{other[lo]:.3f}, {other[lo + 2]:.3f}, {other[half]:.3f} |")  # fmt: skip
        print()
    axes[0].set_ylabel("makespan / Span*")
    axes[0].legend()
    fig.suptitle(
        "Optimal join schedules (Deep Join Networks paper, Figure 7), u_f = u_b = u_t = 1\n"
        "solid: exact pebble game; dashed: Opt_0 in Griewank's checkpoint convention",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(DOCS / "join_fig7.png", dpi=110)
    print("![Figure 7](join_fig7.png)\n")


def fig9() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ls = list(range(1, 21))
    series: dict[int, list[float]] = {9: [], 12: [], 15: []}
    started = time.perf_counter()
    for L in Ls:
        lengths = (2 * L,) * 3
        table = JoinTable(lengths, 15)
        plans = equiv_chain_plans(lengths)
        for c in series:
            best = min(
                plan_cost(plan, 1, 1, 1) for _, plan in plans if plan_peak(lengths, plan) <= c
            )
            series[c].append(best / table.opt(c))
    seconds = time.perf_counter() - started
    fig, ax = plt.subplots(figsize=(6, 4))
    for c, ratios in series.items():
        ax.plot([2 * L + 1 for L in Ls], ratios, marker=".", label=f"c = {c}")
    ax.set_xlabel("length 2L + 1 (SNN, three branches of 2L)")
    ax.set_ylabel("EQUIV-CHAIN / Opt")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("EQUIV-CHAIN / optimal join (Deep Join Networks paper, Fig. 9b)")
    fig.tight_layout()
    fig.savefig(DOCS / "join_fig9.png", dpi=110)
    print("### Figure 9: EQUIV-CHAIN / Opt on SNN\n")
    print("| length 2L+1 | " + " | ".join(f"c = {c}" for c in series) + " |")
    print("|---|" + "---|" * len(series))
    for i, L in enumerate(Ls):
        if L in (1, 2, 3, 5, 8, 10, 15, 20):
            print(f"| {2 * L + 1} | " + " | ".join(f"{series[c][i]:.3f}" for c in series) + " |")
    print(f"\n({seconds:.1f} s for the whole figure)\n")
    print("![Figure 9](join_fig9.png)\n")


def gap() -> None:
    from memplan.algorithms.join.hetero import JoinNet, min_memory_plan
    from tests.oracles.join import chain_model_optimum

    cases = slower = 0
    missed: list[str] = []
    largest = 0.0
    started = time.perf_counter()
    for lengths in ((2, 2), (1, 3), (2, 3), (1, 1, 2), (1, 4)):
        for seed in range(6):
            prof = random_join(lengths, seed=100 + seed, max_size=6)
            net = JoinNet.from_profile(prof)
            least, _ = min_memory_plan(net)
            for memory in range(least - 1, net.peak(net.store_all()) + 1):
                best = chain_model_optimum(prof, memory)
                got = memplan.solve(prof, "join", memory, optimizer="none", slots=10_000)
                cases += 1
                if not got.feasible:
                    if math.isfinite(best):
                        missed.append(f"{lengths} seed {100 + seed} at {memory} B (least {least})")
                elif got.makespan > best + 1e-9:
                    slower += 1
                    largest = max(largest, got.makespan / best - 1)
    print("### Heterogeneous joins: DP against exhaustive search\n")
    print(f"- {cases} (instance, budget) pairs, branches (2,2) (1,3) (2,3) (1,1,2) (1,4), "
          f"6 random instances each, every budget from least memory - 1 to store-all, "
          f"exact slots; {time.perf_counter() - started:.0f} s")  # fmt: skip
    print(f"- DP slower than the exhaustive optimum: {slower} pairs (largest excess "
          f"{largest:.2%})")  # fmt: skip
    print(f"- DP infeasible where a plan exists: {len(missed)} "
          f"({'; '.join(missed) or 'none'})\n")  # fmt: skip


def profiles() -> None:
    from memplan.api import describe

    print("### Bundled join profiles: join against equiv-chain\n")
    for name in ("siamese-resnet18", "cross-modal-resnet18"):
        try:
            prof = memplan.load_profile(name)
        except memplan.InputError:
            print(f"({name} is not bundled)\n")
            continue
        d = describe(prof, "none")
        lo, hi = d["min_memory"]["join"], d["store_all_memory"]
        lengths = [len(b.stages) for b in prof.branches]
        print(f"{name}: branches {lengths}, lower bound {prof.lower_bound:.1f} ms, "
              f"least memory {lo / 1e6:.1f} MB, store-all {hi / 1e6:.1f} MB "
              f"(activations, --optimizer none)\n")  # fmt: skip
        print("| budget (MB) | join (ms) | equiv-chain (ms) | equiv/join | join solve (s) |")
        print("|---|---|---|---|---|")
        for step in range(9):
            memory = lo + (hi - lo) * step // 8
            a = memplan.solve(prof, "join", memory, optimizer="none")
            b = memplan.solve(prof, "equiv-chain", memory, optimizer="none")
            eq = f"{b.makespan:.1f}" if b.feasible else "-"
            ratio = f"{b.makespan / a.makespan:.3f}" if b.feasible else "-"
            print(f"| {memory / 1e6:.1f} | {a.makespan:.1f} | {eq} | {ratio} | "
                  f"{a.solver.seconds:.2f} |")  # fmt: skip
        print()


SECTIONS = {"timing": timing, "fig7": fig7, "fig9": fig9, "gap": gap, "profiles": profiles}


def main(argv: list[str]) -> int:
    names = argv or list(SECTIONS)
    print(f"Machine: {machine()} (shared with other jobs: timings are noisy)\n")
    for name in names:
        SECTIONS[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
