"""Seeded random buffer lists for the allocation benchmarks (benchmarks/bench_alloc_scale.py).

Two shapes, both written as MiniMalloc CSVs (``id,lower,upper,size``):

* ``random``: ``n`` buffers over a timeline of ``n`` steps; each starts at a uniform step, lives
  1 to 59 steps (uniform) and takes 1 byte to 1 MiB (uniform): about 30 buffers live at a time,
  no long-lived ones, many independent parts.
* ``training``: what a compiler sees for training steps of a deep network: per layer a forward
  activation that lives until its gradient is computed (nested lifetimes, long-lived), short
  temporaries around each operator, and gradient buffers, sizes drawn from a few powers of two
  scaled by a per-layer factor. One part (every forward activation crosses the middle).

``python benchmarks/alloc_instances.py random 10000 --seed 1 -o r10k.csv``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

SHAPES = ("random", "short", "training")


def random_rows(
    n: int, seed: int, longest: int = 500, smallest: int = 1 << 10
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``random``: lower uniform in [0, n), lifetime uniform in 1..longest, size uniform in
    smallest..2^20 (omnimalloc's RandomSource, its timeline scaled to n steps)."""
    rng = np.random.default_rng(seed)
    lower = rng.integers(0, n, n)
    upper = lower + rng.integers(1, longest + 1, n)
    size = rng.integers(smallest, (1 << 20) + 1, n)
    return lower, upper, size


def training_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``training``: about n / 4 layers; each has an activation (forward step to its backward
    step), two temporaries of its forward operator, one of its backward and a gradient that lives
    a few steps; sizes are 2^k bytes (k in 10..20) times 1, 3 or 5."""
    rng = np.random.default_rng(seed)
    layers = max(n // 4, 1)
    rows: list[tuple[int, int, int]] = []
    horizon = 2 * layers + 2

    def size() -> int:
        return int((1 << int(rng.integers(10, 21))) * int(rng.choice([1, 3, 5])))

    for k in range(layers):
        forward, backward = 1 + k, horizon - 1 - k
        scale = 1 + int(rng.integers(0, 4))
        rows.append((forward, backward + 1, size() * scale))  # the activation
        rows.append((forward, forward + 1, size()))  # forward temporaries
        rows.append((forward, forward + 1 + int(rng.integers(0, 3)), size()))
        rows.append((backward, backward + 1 + int(rng.integers(1, 4)), size() * scale))  # grad
    rows = rows[:n]
    while len(rows) < n:  # n not a multiple of 4: temporaries of the last steps
        t = int(rng.integers(0, horizon))
        rows.append((t, t + 1, size()))
    lower, upper, sizes = (np.array(col, dtype=np.int64) for col in zip(*rows, strict=True))
    return lower, upper, sizes


def generate(shape: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (lower, upper, size) arrays of one seeded instance."""
    if shape == "random":
        return random_rows(n, seed)
    if shape == "short":
        return random_rows(n, seed, longest=59, smallest=1)
    if shape == "training":
        return training_rows(n, seed)
    raise ValueError(f"shape {shape!r}: expected one of {', '.join(SHAPES)}")


def write_csv(path: Path, lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> None:
    lines = ["id,lower,upper,size"]
    lines += [
        f"{k},{a},{b},{s}" for k, (a, b, s) in enumerate(zip(lower, upper, size, strict=True))
    ]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=SHAPES)
    parser.add_argument("n", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    if args.n < 1:
        sys.exit("n: expected at least 1")
    write_csv(args.output, *generate(args.shape, args.n, args.seed))


if __name__ == "__main__":
    main()
