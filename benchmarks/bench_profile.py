"""What profiling costs, and the user's own commands end to end.

Subcommands (each prints the machine and its load, then a markdown table for docs/benchmarks.md):

``ratio MODEL:BATCH ...``
    ``profile_model(MODEL, batch_size=BATCH, repeats=R)`` against the plain training iterations it
    times: warm-up + instrumented + R repeats, each compared with one plain forward + backward of
    the whole model at that batch (train mode, the chain of stages, the loss included). The plain
    iteration is timed 3 times before and 3 times after the profile (median of the 6), so that
    both see the same load. Wall-clock and CPU seconds (``time.process_time``) are both reported:
    on a loaded machine the wall clock of either side varies with the others' jobs, the CPU
    seconds much less. Goal: ratio <= 1.5.
``estimate [MODEL:BATCH:GPU ...]``
    The user's command ``memplan profile MODEL --batch-size BATCH --estimate GPU`` in a fresh
    process (import, model, sizes, counts, YAML), wall clock; ``--real`` also runs it with
    ``--device cpu`` (the real-tensor path, what ``--estimate`` did before). Goal for resnet50 at
    batch 64 on a100: under 30 s. (``--threads`` does not apply: the command runs as typed.)
``check``
    The fake-tensor estimate against the real CPU run on small inputs of every built-in chain
    model: sizes equal to a CPU profile's, operator counts (times) equal to the real-tensor
    estimate's.
``overheads PROFILE``
    A bundled estimated profile (e.g. ``resnet50@a100``, made with ``--device cpu``) against the
    fake-tensor estimate of the same model and batch: the overheads, and what they change for the
    planners (store-all need, least memory of the chain and offload families).
``pipe``
    ``memplan profile resnet50 | memplan solve --algo dynprog --mem 8GB`` (and ``--algo pofo``),
    exactly as a user types it, in ``bash -o pipefail``: exit status and wall clock.
``readme [--omp N]``
    The README's commands that profile or train (``README_COMMANDS``), as typed, with
    ``OMP_NUM_THREADS`` unset (torch's default) or ``N``: exit status and wall clock.

Usage::

    python benchmarks/bench_profile.py ratio resnet18:16 resnet50:8 --threads 1
    python benchmarks/bench_profile.py estimate --real
    python benchmarks/bench_profile.py check
    python benchmarks/bench_profile.py overheads resnet50@a100
    python benchmarks/bench_profile.py pipe
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine

ROOT = Path(__file__).resolve().parent.parent
MEMPLAN = [str(Path(sys.executable).parent / "memplan")]  # the console script, as users run it


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (1 min) / {five:.1f} (5 min)"


def _header(args: argparse.Namespace) -> None:
    print(f"# {machine()}; torch threads {args.threads}; {_load()} at the start")


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


# --------------------------------------------------------------------------------------------


def _plain_iteration(chain, x) -> tuple[float, float]:
    """(wall, cpu) seconds of one forward + backward of the whole chain, fresh gradients."""
    import torch

    for module in chain.modules:
        for p in module.parameters():
            p.grad = None
    with torch.enable_grad():
        wall, cpu = _clocks()
        chain.forward(x).backward()
        end_wall, end_cpu = _clocks()
    return end_wall - wall, end_cpu - cpu


def ratio(args: argparse.Namespace) -> None:
    import torch

    from memplan.torch.models.registry import build_model
    from memplan.torch.profiler.chain import training_state
    from memplan.torch.profiler.model import profile_model
    from memplan.torch.split.linearize import linearize

    print(
        "| model | batch | stages | plain iteration s (wall / cpu) | iterations timed "
        "| profile s (wall / cpu) | ratio wall | ratio cpu |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for spec in args.models:
        name, batch = spec.split(":")
        model, x, _ = build_model(name, batch_size=int(batch))
        chain = linearize(model, x)
        samples = []
        with training_state(chain.modules):
            _plain_iteration(chain, x)  # warm-up
            samples += [_plain_iteration(chain, x) for _ in range(3)]
        wall, cpu = _clocks()
        prof = profile_model(
            model, example_input=x, repeats=args.repeats, name=name, threads=args.threads
        )
        end_wall, end_cpu = _clocks()
        with training_state(chain.modules):
            samples += [_plain_iteration(chain, x) for _ in range(3)]
        plain_wall = statistics.median(s[0] for s in samples)
        plain_cpu = statistics.median(s[1] for s in samples)
        iterations = 2 + args.repeats
        prof_wall, prof_cpu = end_wall - wall, end_cpu - cpu
        print(
            f"| {name} | {batch} | {prof.length} | {plain_wall:.2f} / {plain_cpu:.2f} "
            f"| {iterations} | {prof_wall:.1f} / {prof_cpu:.1f} "
            f"| {prof_wall / (iterations * plain_wall):.2f} "
            f"| {prof_cpu / (iterations * plain_cpu):.2f} |",
            flush=True,
        )
        del model, chain, x
        torch.manual_seed(0)
    print(f"# {_load()} at the end")


# --------------------------------------------------------------------------------------------


def _timed_command(command: list[str], stdout_path: Path | None = None) -> tuple[int, float, str]:
    """(exit status, wall seconds, last ``memplan:`` line on stderr) of a command in a fresh
    process (the last line when none starts so)."""
    with tempfile.TemporaryFile() as err:
        out = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL  # noqa: SIM115
        started = time.perf_counter()
        try:
            code = subprocess.call(command, stdout=out, stderr=err, cwd=ROOT)
        finally:
            if stdout_path:
                out.close()
        seconds = time.perf_counter() - started
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    said = [line for line in lines if line.startswith("memplan:")] or lines
    return code, seconds, said[-1] if said else ""


def estimate(args: argparse.Namespace) -> None:
    print("| command | exit | wall s | last stderr line |")
    print("|---|---:|---:|---|")
    for spec in args.cases:
        name, batch, gpu = spec.split(":")
        base = ["profile", name, "--batch-size", batch, "--estimate", gpu]
        variants = [base] + ([[*base, "--device", "cpu"]] if args.real else [])
        for argv in variants:  # the user's command as typed: torch's default threads
            code, seconds, last = _timed_command([*MEMPLAN, *argv])
            print(f"| `memplan {' '.join(argv)}` | {code} | {seconds:.1f} | {last} |", flush=True)
    print(f"# {_load()} at the end")


# --------------------------------------------------------------------------------------------

CHECK = {  # model -> (batch, input shape): small inputs, every built-in chain model
    "resnet18": (2, (3, 64, 64)),
    "resnet50": (2, (3, 32, 32)),
    "vgg11": (2, (3, 32, 32)),
    "densenet121": (2, (3, 32, 32)),
    "mobilenet_v2": (2, (3, 32, 32)),
    "inception_v3": (2, (3, 75, 75)),
    "gpt-tiny": (2, (16,)),
    "gpt-small": (1, (32,)),
}
SIZES = ("name", "output_size", "saved_size", "weight_size", "grad_size")
COUNTS = ("forward_time", "backward_time", "extra")


def check(args: argparse.Namespace) -> None:
    from memplan.torch.profiler.model import profile_model

    print(
        "| model | input | stages | sizes = CPU profile's | counts = real estimate's "
        "| overheads = CPU profile's | overheads <= CPU profile's | fake s | real estimate s |"
    )
    print("|---|---|---:|---|---|---|---|---:|---:|")
    for name, (batch, shape) in CHECK.items():
        kwargs = {"batch_size": batch, "input_shape": shape}
        wall = time.perf_counter()
        fake = profile_model(name, estimate="a100", **kwargs)
        fake_s = time.perf_counter() - wall
        wall = time.perf_counter()
        real = profile_model(name, estimate="a100", device="cpu", **kwargs)
        real_s = time.perf_counter() - wall
        measured = profile_model(name, repeats=1, **kwargs)

        def same(fields, a, b):
            return all(
                [getattr(s, k) for k in fields] == [getattr(t, k) for k in fields]
                for s, t in zip(a.stages, b.stages, strict=True)
            )

        sizes = same(SIZES, fake, measured) and fake.input_size == measured.input_size
        counts = same(COUNTS, fake, real)
        pairs = list(zip(fake.stages, measured.stages, strict=True))
        overheads = sum(
            (s.forward_overhead, s.backward_overhead) == (t.forward_overhead, t.backward_overhead)
            for s, t in pairs
        )
        at_most = all(
            s.forward_overhead <= t.forward_overhead and s.backward_overhead <= t.backward_overhead
            for s, t in pairs
        )
        dims = f"{batch} x {'x'.join(map(str, shape))}"
        print(
            f"| {name} | {dims} | {fake.length} | {'yes' if sizes else 'NO'} "
            f"| {'yes' if counts else 'NO'} | {overheads}/{fake.length} stages "
            f"| {'yes' if at_most else 'NO'} "
            f"| {fake_s:.1f} | {real_s:.1f} |",
            flush=True,
        )


# --------------------------------------------------------------------------------------------


def overheads(args: argparse.Namespace) -> None:
    import memplan
    from memplan.api import describe
    from memplan.torch.profiler.model import profile_model

    bundled = memplan.load_profile(args.profile)
    gpu = (bundled.measured.estimate or {}).get("catalog")
    wall = time.perf_counter()
    fake = profile_model(
        bundled.model,
        batch_size=bundled.batch_size,
        input_shape=tuple(bundled.input_shape),
        dtype=bundled.dtype or "float32",
        estimate=gpu,
    )
    seconds = time.perf_counter() - wall
    print(
        f"# fake-tensor estimate of {bundled.model} at batch {bundled.batch_size}: {seconds:.1f} s"
    )
    print("| stage | forward overhead: bundled / fake | backward overhead: bundled / fake |")
    print("|---|---:|---:|")
    mib = 2**20
    for a, b in zip(bundled.stages, fake.stages, strict=True):
        print(
            f"| {a.name} | {a.forward_overhead / mib:.1f} / {b.forward_overhead / mib:.1f} MiB "
            f"| {a.backward_overhead / mib:.1f} / {b.backward_overhead / mib:.1f} MiB |"
        )
    print()
    print("| need (optimizer none) | bundled | fake | fake / bundled |")
    print("|---|---:|---:|---:|")
    old, new = describe(bundled, "none"), describe(fake, "none")
    rows = [("store-all", old["store_all_memory"], new["store_all_memory"])]
    rows += [(f"least, {f}", old["min_memory"][f], new["min_memory"][f]) for f in old["min_memory"]]
    for what, a, b in rows:
        if a is None or b is None:
            continue
        print(f"| {what} | {a / 1e9:.3f} GB | {b / 1e9:.3f} GB | {b / a:.3f} |")


# --------------------------------------------------------------------------------------------


def pipe(args: argparse.Namespace) -> None:
    print("| command (bash -o pipefail) | exit | wall s | last stderr line |")
    print("|---|---:|---:|---|")
    for algo in ("dynprog", "pofo"):
        line = f"memplan profile resnet50 | memplan solve --algo {algo} --mem 8GB"
        command = ["bash", "-o", "pipefail", "-c", f"source .venv/bin/activate && {line}"]
        code, seconds, last = _timed_command(command)
        print(f"| `{line}` | {code} | {seconds:.0f} | {last} |", flush=True)
    print(f"# {_load()} at the end")


README_COMMANDS = (
    "memplan profile resnet18 --batch-size 16 -o resnet18.yaml",
    "memplan profile gpt-small --batch-size 1 --input-shape 512 > gpt-small.yaml",
    "memplan profile hf:gpt2 --batch-size 1 --input-shape 128 > gpt2.yaml",
    "memplan profile hf:llama-1b --config num_hidden_layers=4 -b 1 --input-shape 512 > llama.yaml",
    "memplan profile resnet50 --batch-size 64 --estimate a100 -o resnet50@a100.yaml",
    "memplan profile resnet18 | memplan solve --algo rotor --mem 2GB",
    "memplan profile resnet50 | memplan solve --algo dynprog --mem 8GB",
    "memplan run resnet18 --algo rotor --mem 200MB -b 32 --input-shape 3,96,96",
    "memplan run resnet18 --algo rotor --mem 150MB --steps 3 -b 2 --input-shape 3,64,64",
    "memplan profile resnet50 --graph -b 32 > resnet50-graph.yaml",
)
"""The README's commands that profile or train, as typed (their output to files)."""


def readme(args: argparse.Namespace) -> None:
    """Every command of :data:`README_COMMANDS`, as typed, in ``bash -o pipefail`` in a fresh
    directory, with ``OMP_NUM_THREADS`` as given (``--omp``) or unset (torch's default)."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if args.omp:
        env["OMP_NUM_THREADS"] = str(args.omp)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    threads = f"OMP_NUM_THREADS={args.omp}" if args.omp else "OMP_NUM_THREADS unset"
    print(f"| command ({threads}) | exit | wall s | load (1 min) | last stderr line |")
    print("|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="memplan-readme-") as tmp:
        for line in args.lines or README_COMMANDS:
            started = time.perf_counter()
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", line],
                cwd=tmp,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            seconds = time.perf_counter() - started
            said = [x for x in done.stderr.splitlines() if x.startswith("memplan:")]
            last = (said or done.stderr.splitlines() or [""])[-1][:120].replace("|", "\\|")
            load = os.getloadavg()[0]
            print(
                f"| `{line}` | {done.returncode} | {seconds:.0f} | {load:.1f} | {last} |",
                flush=True,
            )
    print(f"# {_load()} at the end")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ratio", help="profile cost against the plain iterations it times")
    p.add_argument("models", nargs="+", metavar="MODEL:BATCH")
    p.add_argument("--repeats", type=int, default=5)
    p = sub.add_parser("estimate", help="memplan profile ... --estimate GPU, wall clock")
    p.add_argument("cases", nargs="*", metavar="MODEL:BATCH:GPU", default=["resnet50:64:a100"])
    p.add_argument("--real", action="store_true", help="also with --device cpu (real tensors)")
    sub.add_parser("check", help="fake-tensor estimate against real CPU runs, small inputs")
    p = sub.add_parser("overheads", help="a bundled estimated profile against the fake estimate")
    p.add_argument("profile")
    sub.add_parser("pipe", help="the README's profile | solve pipes, exactly")
    p = sub.add_parser("readme", help="the README's profile and run commands, as typed")
    p.add_argument("--omp", type=int, help="OMP_NUM_THREADS for the commands (default: unset)")
    p.add_argument("lines", nargs="*", help="other command lines instead")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    _header(args)
    commands = {
        "ratio": ratio,
        "estimate": estimate,
        "check": check,
        "overheads": overheads,
        "pipe": pipe,
        "readme": readme,
    }
    commands[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
