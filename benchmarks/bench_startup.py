"""Start-up time of the memplan command.

Times fresh processes of this environment's memplan (its entry point ``memplan.cli.app:main``,
what the installed ``memplan`` script runs), as CI pipelines call it:

- ``memplan --version`` and ``memplan algos`` (goal: under 0.15 s of CPU each; issue 40 item 7);
- ``memplan --help`` (every command listed);
- ``memplan solve resnet50 --algo rotor --mem 1GB`` (goal: under 0.6 s in total, the solve
  included);

beside two anchors measured in the same run: ``python -c pass`` (the interpreter, with this
environment's site-packages) and ``python -c "import typer"`` (the CLI framework alone).

Each command runs ``--runs`` times after one warm-up run (which also writes the byte code, as an
installed package has it); the median and the least wall time are reported, with the median CPU
time of the process (user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``), which a
shared machine's load changes less than the wall time. The load average is printed before and
after. Then ``python -X importtime`` of each command lists the packages that take the longest to
import (the self times of their modules, summed per top-level package).

``--compare DIR`` times the memplan of another checkout beside this one, command by command, in
the same run (a ``git worktree`` of the commit to compare with; its compiled core must be there:
link ``memplan/_core*.so`` of this environment into ``DIR/memplan/`` when the C++ sources are the
same). Its children import memplan from DIR, with any editable-install redirect removed.

Byte code: where ``PYTHONDONTWRITEBYTECODE`` is set, every run would compile memplan's and its
dependencies' sources again (seconds, for torch). The children run with it unset and with
``PYTHONPYCACHEPREFIX`` in a temporary directory, so the measured runs read byte code, as they do
after ``pip install``, without writing into the installation.

Usage::

    python benchmarks/bench_startup.py            # 11 runs of each command
    python benchmarks/bench_startup.py --runs 21 --top 12
    git worktree add /tmp/base main && ln -s $PWD/.venv/lib/python3.11/site-packages/memplan/_core*.so \\
        /tmp/base/memplan/ && python benchmarks/bench_startup.py --compare /tmp/base
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

COMMANDS: dict[str, tuple[list[str], float | None]] = {
    "memplan --version": (["--version"], 0.15),
    "memplan algos": (["algos"], 0.15),
    "memplan --help": (["--help"], None),
    "memplan solve resnet50 --algo rotor --mem 1GB": (
        ["solve", "resnet50", "--algo", "rotor", "--mem", "1GB"],
        0.6,
    ),
}
"""Label -> (arguments, goal in CPU seconds or None)."""

ANCHORS = {"python -c pass": "pass", "python -c 'import typer'": "import typer"}

# Run memplan's entry point as the `memplan` script does; for another checkout, first drop an
# editable install's import redirect (it would win over sys.path) and put the checkout first.
DRIVER = "import sys\nsys.argv[0] = 'memplan'\nfrom memplan.cli.app import main\nmain()\n"
ELSEWHERE = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__]\n"
    "sys.path.insert(0, {root!r})\n"
)


def child_env(pycache: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def memplan_argv(args: list[str], root: Path | None = None) -> list[str]:
    """A fresh process running this environment's memplan, or that of checkout ``root``."""
    code = DRIVER if root is None else ELSEWHERE.format(root=str(root)) + DRIVER
    return [sys.executable, "-c", code, *args]


def time_runs(argv: list[str], runs: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``runs`` fresh processes of ``argv`` (after one warm-up)."""
    subprocess.run(argv, env=env, capture_output=True, check=True)
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(
            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        )
    return walls, cpus


IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def top_imports(argv: list[str], env: dict[str, str], top: int) -> tuple[float, list[tuple]]:
    """Total import seconds of a memplan process and the ``top`` packages that take the longest:
    the self times of all their modules, summed per top-level package (numpy, pydantic, ...)."""
    done = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True
    )
    per_package: dict[str, float] = {}
    for line in done.stderr.splitlines():
        found = IMPORT_LINE.match(line)
        if found:
            package = found.group(4).split(".")[0]
            per_package[package] = per_package.get(package, 0.0) + int(found.group(1)) / 1e6
    rows = sorted(((seconds, name) for name, seconds in per_package.items()), reverse=True)
    return sum(per_package.values()), rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="timed runs per command")
    parser.add_argument("--top", type=int, default=8, help="slowest imports listed")
    parser.add_argument(
        "--compare", type=Path, metavar="DIR", help="another checkout, timed beside this one"
    )
    args = parser.parse_args()

    print(f"machine: {machine()}; each command one process, one thread of Python")
    import memplan

    where = Path(memplan.__file__).parent.parent
    print(f"memplan: {where}" + (f"; compared with {args.compare}" if args.compare else ""))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="memplan-pycache-") as pycache:
        env = child_env(pycache)
        print()
        header = "| command | median wall s | least wall s | median CPU s | goal | runs |"
        if args.compare:
            header += " median CPU s, compared | CPU ratio |"  # this one / the other
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
        for label, code in ANCHORS.items():
            walls, cpus = time_runs([sys.executable, "-c", code], args.runs, env)
            row = (
                f"| `{label}` | {statistics.median(walls):.3f} | {min(walls):.3f} | "
                f"{statistics.median(cpus):.3f} | anchor | {args.runs} |"
            )
            print(row + (" | |" if args.compare else ""))
        for label, (argv, goal) in COMMANDS.items():
            walls, cpus = time_runs(memplan_argv(argv), args.runs, env)
            cpu = statistics.median(cpus)
            row = (
                f"| `{label}` | {statistics.median(walls):.3f} | {min(walls):.3f} | {cpu:.3f} | "
                f"{'-' if goal is None else f'< {goal} s'} | {args.runs} |"
            )
            if args.compare:
                _, other = time_runs(memplan_argv(argv, args.compare), args.runs, env)
                before = statistics.median(other)
                row += f" {before:.3f} | {cpu / before:.2f} |"
            print(row)
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for label, (argv, _) in COMMANDS.items():
            total, rows = top_imports(memplan_argv(argv), env, args.top)
            print(f"\n`python -X importtime`, {label}: {total:.3f} s of imports; per package:")
            for seconds, name in rows:
                print(f"  {seconds:7.3f} s  {name}")


if __name__ == "__main__":
    main()
