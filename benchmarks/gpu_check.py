"""``make gpu-check``: the measured-peak benchmark on a CUDA GPU, and the estimate against it.

Run it unchanged on a machine with an NVIDIA GPU (``make gpu-check`` or
``python benchmarks/gpu_check.py --out gpu-check``); it refuses to run without CUDA (exit 2).
It has NOT been run by the engineer who wrote it (no GPU then): docs/benchmarks.md says so until
its results replace that line.

1. **The catalog.** The GPU is looked up in ``memplan/data/gpus.yaml`` by its CUDA device name.
   When it is missing, the script measures an entry (host link: pinned copies, as the profiler
   does; device memory bandwidth: device-to-device copies; FLOP/s: large matrix products per data
   type; the memory CUDA reports), writes it to ``OUT/gpu-entry.yaml`` with sources saying the
   numbers are achieved rates measured here, not datasheet peaks, and, with
   ``--add-to-catalog``, appends it to the catalog (review it before committing).
2. **Profiles.** Each model of ``bench_measure.MODELS`` is profiled on the GPU with the CLI
   (``memplan profile MODEL --device cuda ... -o OUT/profiles/MODEL.yaml``: CUDA times,
   ``torch.cuda.max_memory_allocated`` overheads, the measured host bandwidth) and estimated for
   the GPU's catalog entry (``--estimate KEY`` or ``--gpu-spec OUT/gpu-entry.yaml``).
   ``OUT/estimate-vs-measured.md`` compares them stage by stage: forward and backward times
   (estimate / measured), and the sizes (the estimate's are measured on the CPU).
3. **Every point.** For each model, optimizer (sgd, momentum, adam), 8 budgets from the least
   memory to the store-all need and algorithm (rotor, revolve, periodic, dynprog, pofo), the exact
   command ``memplan run MODEL --algo A --mem B --profile OUT/profiles/MODEL.yaml --device cuda
   --optimizer O --format json`` runs (in this process, through the CLI): the plan's offloads use
   pinned host buffers and a side stream, the measured peak is
   ``torch.cuda.max_memory_allocated`` over the whole step. ``OUT/gpu-measure.json`` holds every
   document, ``OUT/gpu-measure.md`` the tables of ``bench_measure.py --report``.
4. **What ``enable`` costs in time** (``benchmarks/bench_enable_overhead.py --device cuda``,
   wall clock after a synchronization): a store-all plan against plain training and the plan at
   Hugging Face checkpointing's measured peak against HF checkpointing, paired medians, on the
   12-layer, 64-wide GPT-2 at batch 2 x 32 and on GPT-2 8 x 256 at batch 4 x 256 (issue 35);
   ``OUT/enable-overhead-*.json`` and ``.txt``. ``--skip-overhead`` leaves it out.
5. **FSDP2.** ``bench_fsdp.py --device cuda --model M`` on every GPU the machine has (one rank
   each, NCCL) for each of :data:`FSDP_MODELS` (memplan's zoo GPT with the caller's loss; Hugging
   Face GPT-2 and Llama with their own loss, in chunks by hand and in memplan's plans at GPT-2's
   vocabulary-to-width ratio, issue 38's goal): FSDP2, FSDP2 + per-block checkpointing and
   memplan's plans, per-rank peaks and paired step times; ``OUT/fsdp-M/fsdp.md`` and
   ``fsdp.json`` (``--skip-fsdp`` leaves it out).

Exit 0 when every measured peak is within its budget, 1 otherwise, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from _common import machine
from bench_measure import ALGOS, MODELS, OPTIMIZERS, budgets_of, report

import memplan
from memplan.gpu import CATALOG_PATH, gpu_catalog, gpu_from_dict
from memplan.units import format_size

FSDP_MODELS: dict[str, list[str]] = {
    "gpt": [],
    "gpt2": ["--vocab", "8192"],  # 64 x the width, as GPT-2's own 50,257 / 768
    "llama": ["--vocab", "8192"],
}
"""Step 5's models and their ``bench_fsdp.py`` options (its defaults otherwise)."""


def _cli(args: list[str]) -> tuple[int, str, str]:
    """Run ``memplan ARGS`` in this process; (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from memplan.cli.app import app

    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def _released(torch: Any) -> int:
    """Free what earlier points left for the garbage collector (a command stopped by an exit
    keeps its frames, the model among them, in a reference cycle) and return the bytes still
    allocated on the GPU: each point is measured as in a process of its own."""
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    return int(torch.cuda.memory_allocated())


def catalog_key(device_name: str) -> str | None:
    """The catalog key whose ``name`` is the CUDA device name, if any."""
    for key, spec in gpu_catalog().items():
        if spec.name.strip().lower() == device_name.strip().lower():
            return key
    return None


def _median_seconds(fn: Any, repeats: int = 5) -> float:
    import statistics

    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measured_entry(device: Any) -> dict[str, Any]:
    """A catalog entry for this GPU from rates measured on it (achieved, not datasheet peaks)."""
    import torch

    from memplan.torch.measure.bandwidth import measure_bandwidth

    props = torch.cuda.get_device_properties(device)
    host = measure_bandwidth(device)
    nbytes = 2**30
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    hbm = 2 * nbytes / _median_seconds(lambda src=a, dst=b: dst.copy_(src))  # read + write
    del a, b
    flops: dict[str, float] = {}
    n = 8192
    for key, dtype, tf32 in (
        ("float32", torch.float32, False),
        ("tf32", torch.float32, True),
        ("float16", torch.float16, False),
        ("bfloat16", torch.bfloat16, False),
    ):
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            x = torch.randn(n, n, device=device, dtype=dtype)
            y = torch.randn(n, n, device=device, dtype=dtype)
            flops[key] = 2 * n**3 / _median_seconds(lambda x=x, y=y: x @ y)
            del x, y
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    fields = ["hbm_bandwidth", "host_bandwidth", *(f"peak_flops.{k}" for k in flops)]
    entry = {
        "name": props.name,
        "description": f"{props.name} (measured by benchmarks/gpu_check.py)",
        "memory": int(props.total_memory),
        "hbm_bandwidth": float(hbm),
        "host_bandwidth": float(host),
        "peak_flops": {k: float(v) for k, v in flops.items()},
        "efficiency": {"tensor_core": 0.6, "cuda_core": 0.8, "memory": 0.8},
        "launch_cost": 5.0e-6,
        "sources": [
            {
                "fields": ["memory"],
                "document": "torch.cuda.get_device_properties(device).total_memory",
                "note": f"what CUDA reports on this machine ({today}), not the nominal capacity",
            },
            {
                "fields": fields,
                "document": f"measured by benchmarks/gpu_check.py on {today}",
                "note": (
                    "ACHIEVED rates, not datasheet peaks: pinned host<->device copies (the "
                    "slower direction), a 1 GiB device-to-device copy (read + write), "
                    f"{n}x{n} matrix products per data type. Replace them with the datasheet's "
                    "dense peaks (and cite it) before relying on --estimate for this GPU."
                ),
            },
            {
                "fields": ["efficiency.tensor_core", "efficiency.cuda_core", "efficiency.memory"],
                "document": "memplan assumption (docs/estimation.md)",
            },
            {"fields": ["launch_cost"], "document": "memplan assumption (docs/estimation.md)"},
        ],
    }
    gpu_from_dict(entry, "measured entry")  # validated as a catalog entry
    return entry


def _key_for(name: str) -> str:
    letters = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return "-".join(part for part in letters.split("-") if part and part != "nvidia")


def add_to_catalog(key: str, entry: dict[str, Any]) -> None:
    """Append ``entry`` under ``gpus:`` of the bundled catalog (YAML text appended as is)."""
    block = yaml.safe_dump({key: entry}, sort_keys=False, width=100)
    indented = "".join(f"  {line}\n" if line else "\n" for line in block.splitlines())
    with CATALOG_PATH.open("a", encoding="utf-8") as handle:
        handle.write("\n" + indented)


def compare_estimate(name: str, measured: memplan.Profile, estimated: memplan.Profile) -> str:
    """Markdown: the estimate against the GPU's measure, stage by stage."""
    rows = [
        f"#### {name}",
        "",
        "| stage | forward ms measured | estimated | est./meas. | backward ms measured | "
        "estimated | est./meas. | saved MB measured | estimated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m, e in zip(measured.stages, estimated.stages, strict=True):

        def ratio(a: float, b: float) -> str:
            return f"{a / b:.2f}" if b > 0 else "-"

        rows.append(
            f"| {m.name} | {m.forward_time:.3f} | {e.forward_time:.3f} | "
            f"{ratio(e.forward_time, m.forward_time)} | {m.backward_time:.3f} | "
            f"{e.backward_time:.3f} | {ratio(e.backward_time, m.backward_time)} | "
            f"{m.saved_size / 1e6:.2f} | {e.saved_size / 1e6:.2f} |"
        )
    total_m = sum(s.forward_time + s.backward_time for s in measured.stages)
    total_e = sum(s.forward_time + s.backward_time for s in estimated.stages)
    rows.append("")
    rows.append(
        f"Iteration (sum of the stages): measured {total_m:.2f} ms, estimated {total_e:.2f} ms "
        f"({total_e / total_m:.2f} x)."
    )
    return "\n".join(rows)


OVERHEAD_SIZES = {
    "small": [],  # bench_enable_overhead's default: GPT-2 12 x 64, batch 2 x 32
    "gpt2-8x256": [
        "--config", "n_layer=8,n_embd=256,n_head=4,n_positions=256,attn_pdrop=0.0",
        "-b", "4", "--tokens", "256",
    ],
}  # fmt: skip
"""The models of issue 35's overhead figures (the second with GPT-2's 50,257 tokens)."""


def enable_overhead(out: Path, rounds: int) -> None:
    """Step 4: ``bench_enable_overhead.py`` on CUDA for each of :data:`OVERHEAD_SIZES`."""
    import contextlib
    import io

    from bench_enable_overhead import main as overhead

    for name, extra in OVERHEAD_SIZES.items():
        path = out / f"enable-overhead-{name}.json"
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            overhead(["--device", "cuda", "--rounds", str(rounds), "--out", str(path), *extra])
        (out / f"enable-overhead-{name}.txt").write_text(printed.getvalue())
        print(printed.getvalue(), end="", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--budgets", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--add-to-catalog", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true", help="leave out step 4")
    parser.add_argument("--overhead-rounds", type=int, default=60)
    parser.add_argument("--skip-fsdp", action="store_true", help="leave out bench_fsdp.py")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device here; run it on a machine with an NVIDIA GPU",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda")
    out = args.out
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(
        f"# {machine()}; {torch.cuda.get_device_name(device)}; torch {torch.__version__}",
        flush=True,
    )

    device_name = torch.cuda.get_device_name(device)
    key = catalog_key(device_name)
    estimate_args: list[str]
    if key is None:
        entry = measured_entry(device)
        path = out / "gpu-entry.yaml"
        path.write_text(yaml.safe_dump(entry, sort_keys=False, width=100))
        key = _key_for(device_name)
        print(
            f"# {device_name} is not in the catalog: measured entry {key!r} in {path}", flush=True
        )
        if args.add_to_catalog:
            add_to_catalog(key, entry)
            print(f"# appended to {CATALOG_PATH}: review it before committing", flush=True)
        estimate_args = ["--gpu-spec", str(path)]
    else:
        print(f"# catalog entry: {key}", flush=True)
        estimate_args = ["--estimate", key]

    comparisons, results, failures = [], [], 0
    for name in [m for m in args.models.split(",") if m]:
        config = MODELS[name]
        shape = ",".join(str(d) for d in config["input_shape"])
        common = [name, "-b", str(config["batch_size"]), "--input-shape", shape]
        measured_path = out / "profiles" / f"{name}.yaml"
        estimated_path = out / "profiles" / f"{name}-estimate.yaml"
        for target, extra in (
            (measured_path, ["--device", "cuda"]),
            (estimated_path, estimate_args),
        ):
            code, _, err = _cli(["profile", *common, *extra, "-o", str(target)])
            if code != 0:
                print(f"# memplan profile {name} {' '.join(extra)} failed ({code}): {err.strip()}")
                return 1
        measured = memplan.load_profile(str(measured_path))
        comparisons.append(
            compare_estimate(name, measured, memplan.load_profile(str(estimated_path)))
        )
        points = []
        for optimizer in args.optimizers.split(","):
            for budget in budgets_of(measured, optimizer, args.budgets):
                for algo in args.algos.split(","):
                    command = [
                        "run", *common, "--algo", algo, "--mem", str(budget), "--profile",
                        str(measured_path), "--device", "cuda", "--optimizer", optimizer,
                        "--steps", str(args.steps), "--format", "json",
                    ]  # fmt: skip
                    leftover = _released(torch)
                    code, stdout, err = _cli(command)
                    point: dict[str, Any] = {
                        "model": name,
                        "optimizer": optimizer,
                        "algorithm": algo,
                        "budget": budget,
                        "feasible": code in (0, 1) and bool(stdout.strip()),
                        "command": "memplan " + " ".join(command),
                        "leftover": leftover,
                    }
                    if code not in (0, 1):
                        point["error"] = err.strip()
                    elif point["feasible"]:
                        doc = json.loads(stdout)
                        point.update(
                            planned=doc["planned_peak_memory"],
                            measured=doc["measured_peak_memory"],
                            step_peaks=doc["measured_step_peaks"],
                            over_budget=doc["measured_over_budget"],
                            over_plan=doc["measured_over_planned"],
                            offloaded=doc["offloaded_bytes"],
                            step_ms=doc["step_ms"],
                        )
                        failures += not doc["within_budget"]
                    points.append(point)
                    status = (
                        "no plan"
                        if "measured" not in point
                        else f"{format_size(point['measured'])} ({point['over_budget']:.3f})"
                    )
                    if leftover:
                        status += f"; {format_size(leftover)} left on the GPU by earlier points"
                    print(f"{name} {optimizer} {algo} {format_size(budget)}: {status}", flush=True)
        results.append(
            {
                "model": name,
                "config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
                "device": "cuda",
                "device_name": device_name,
                "bandwidth": measured.bandwidth,
                "points": points,
            }
        )
        doc = {"machine": machine(), "gpu": device_name, "seconds": time.perf_counter() - started}
        (out / "gpu-measure.json").write_text(json.dumps({**doc, "results": results}, indent=1))
    (out / "gpu-measure.md").write_text(report(results) + "\n")
    (out / "estimate-vs-measured.md").write_text("\n\n".join(comparisons) + "\n")
    if not args.skip_overhead:
        enable_overhead(out, args.overhead_rounds)
    if not args.skip_fsdp:  # FSDP2 on every GPU here, one rank each
        import bench_fsdp

        for model, extra in FSDP_MODELS.items():
            argv = ["--device", "cuda", "--model", model, *extra]
            failures += bench_fsdp.check([*argv, "--out", str(out / f"fsdp-{model}")])
    print(f"# wall time {time.perf_counter() - started:.0f} s; results in {out}/")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
