"""Calibrate the roofline estimator against this machine's CPU (docs/benchmarks.md).

The estimator (docs/estimation.md) turns per-operator FLOP and byte counts into times with a
device spec. Here the device is this CPU: its spec comes from two micro-benchmarks (a float32
matmul for the FLOP rate, a copy into a fresh allocation for the memory bandwidth, as PyTorch's CPU
allocator hands out fresh pages for large tensors) and the cost of a tiny op (the per-kernel
overhead). Each bundled CPU profile's model is then estimated with that spec at the profile's own
batch size and input shape, and the estimated per-stage forward and backward times are compared
with the measured ones. This checks the FLOP and byte counting: with the device's own rates the
estimate should land near the measurement.

Usage: ``python benchmarks/calibrate_cpu.py [--threads 2] [profile ...]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

import memplan
from memplan.profile import bundled_profiles
from memplan.torch.profiler.model import profile_model


def _best(fn, repeats: int = 5) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def cpu_specs() -> dict[str, dict]:
    """Device specs for this CPU from micro-benchmarks (the fields of memplan.gpu.GpuSpec).

    Two variants differ only in the memory bandwidth: a copy into fresh memory (page faults
    included, as for a new large tensor) and into warm memory (a reused buffer).
    """
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    flops = 2 * n**3 / _best(lambda: a @ b)
    x = torch.randn(64 * 2**20)  # 256 MiB
    fresh = 2 * x.nbytes / _best(lambda: x.clone())
    out = torch.empty_like(x)
    warm = 2 * x.nbytes / _best(lambda: out.copy_(x))
    one = torch.ones(1)
    launch = _best(lambda: [one + one for _ in range(1000)]) / 1000
    print(
        f"micro-benchmarks: matmul {flops / 1e9:.1f} GFLOP/s, copy into fresh memory "
        f"{fresh / 1e9:.2f} GB/s (into warm memory {warm / 1e9:.2f} GB/s), "
        f"tiny op {launch * 1e6:.1f} us",
        flush=True,
    )
    return {
        label: {
            "name": f"this CPU (micro-benchmarked, {label} memory)",
            "memory": 2**34,
            "hbm_bandwidth": bandwidth,
            "host_bandwidth": bandwidth,
            "peak_flops": {"float32": flops},
            "efficiency": {"tensor_core": 1.0, "cuda_core": 1.0, "memory": 1.0},
            "launch_cost": launch,
        }
        for label, bandwidth in (("fresh", fresh), ("warm", warm))
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="bundled CPU profiles (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    specs = cpu_specs()
    names = args.names or [n for n in bundled_profiles() if "@" not in n]
    print(
        "| profile | memory bw | stages | measured ms | estimated ms | estimate / measured | "
        "per-stage ratio: median | geo. mean | min | max | within 2x |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (label, spec) in ((n, s) for n in names for s in specs.items()):
        measured = memplan.load_profile(name)
        estimated = profile_model(
            measured.model,
            batch_size=measured.batch_size,
            input_shape=tuple(measured.input_shape),
            device="cpu",
            gpu_spec=spec,
        )
        ratios = []
        for real, est in zip(measured.stages, estimated.stages, strict=True):
            for m, e in (
                (real.forward_time, est.forward_time),
                (real.backward_time, est.backward_time),
            ):
                if m > 0.05:  # below 50 us the CPU timer noise dominates
                    ratios.append(e / m)
        geo = math.exp(statistics.fmean(math.log(r) for r in ratios))
        within = sum(1 for r in ratios if 0.5 <= r <= 2.0) / len(ratios)
        print(
            f"| {name} | {label} | {measured.length} | {measured.lower_bound:.0f} | "
            f"{estimated.lower_bound:.0f} | {estimated.lower_bound / measured.lower_bound:.2f} | "
            f"{statistics.median(ratios):.2f} | {geo:.2f} | {min(ratios):.2f} | "
            f"{max(ratios):.2f} | {within:.0%} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
