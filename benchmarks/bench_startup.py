"""Start-up time of the memplan command.

Times fresh processes of the installed ``memplan`` script, as CI pipelines call it:

- ``memplan --version`` (goal: under 0.3 s on an idle machine);
- ``memplan solve resnet50 --algo rotor --mem 1GB`` (goal: under 0.6 s in total, the solve
  included).

Each command runs ``--runs`` times after one warm-up run (which also writes the byte code, as an
installed package has it); the median and the least wall time are reported, with the median CPU
time of the process (user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``), which a
shared machine's load changes less than the wall time. The load average is printed before and
after. Then ``python -X importtime`` of each command lists the packages that take the longest to
import (the self times of their modules, summed per top-level package).

Byte code: where ``PYTHONDONTWRITEBYTECODE`` is set, every run would compile memplan's and its
dependencies' sources again (seconds, for torch). The children run with it unset and with
``PYTHONPYCACHEPREFIX`` in a temporary directory, so the measured runs read byte code, as they do
after ``pip install``, without writing into the installation.

Usage::

    python benchmarks/bench_startup.py            # 11 runs of each command
    python benchmarks/bench_startup.py --runs 21 --top 12
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

COMMANDS = {
    "memplan --version": (["--version"], 0.3),
    "memplan solve resnet50 --algo rotor --mem 1GB": (
        ["solve", "resnet50", "--algo", "rotor", "--mem", "1GB"],
        0.6,
    ),
}


def memplan_command() -> list[str]:
    """The installed ``memplan`` script beside this Python, else ``python -m memplan``."""
    script = Path(sys.executable).parent / "memplan"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memplan"]


def child_env(pycache: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


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


def top_imports(args: list[str], env: dict[str, str], top: int) -> tuple[float, list[tuple]]:
    """Total import seconds of ``memplan ARGS`` and the ``top`` packages that take the longest:
    the self times of all their modules, summed per top-level package (numpy, pydantic, ...)."""
    code = "import sys; from memplan.cli.app import main; sys.argv[0] = 'memplan'; main()"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
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
    args = parser.parse_args()

    memplan = memplan_command()
    print(f"machine: {machine()}")
    print(f"command: {' '.join(memplan)}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="memplan-pycache-") as pycache:
        env = child_env(pycache)
        print()
        print("| command | median wall s | least wall s | median CPU s | goal | runs |")
        print("|---|---|---|---|---|---|")
        for label, (argv, goal) in COMMANDS.items():
            walls, cpus = time_runs([*memplan, *argv], args.runs, env)
            print(
                f"| `{label}` | {statistics.median(walls):.3f} | {min(walls):.3f} | "
                f"{statistics.median(cpus):.3f} | < {goal} s | {args.runs} |"
            )
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for label, (argv, _) in COMMANDS.items():
            total, rows = top_imports(argv, env, args.top)
            print(f"\n`python -X importtime`, {label}: {total:.3f} s of imports; per package:")
            for seconds, name in rows:
                print(f"  {seconds:7.3f} s  {name}")


if __name__ == "__main__":
    main()
