"""Regenerate the profiles bundled with memplan (``memplan/profiles/*.yaml``) on this machine.

Each profile is measured with :func:`memplan.torch.profile_model` and written atomically with
:func:`memplan.profile.save_profile`; the bundled name is the file stem (``resnet50.yaml`` is
``memplan solve resnet50 ...``). The sizes below keep the whole run to about a quarter of an hour
on two CPU cores; the device recorded in each file is the machine that ran the script.

The transformers (``hf:`` models, the ``hf`` extra) are built from their ``transformers`` config
classes with random weights. Estimated ones are profiled in bfloat16 (:data:`DTYPES`), the way
they are trained today; the measured ones in float32 at small sizes.

What each takes on two loaded CPU cores (real tensors; ``--estimate`` with fake tensors will make
the estimated ones cheap): most profiles a few minutes; ``llama-1b@a100`` and ``llama-1b@h100``
(1.24 B parameters, 2048 tokens, bfloat16) are the expensive ones, see docs/profiling.md.

Usage::

    python benchmarks/make_profiles.py                    # every profile
    python benchmarks/make_profiles.py resnet18 gpt-small # some of them
    python benchmarks/make_profiles.py --list
    python benchmarks/make_profiles.py --threads 1 siamese-resnet18 cross-modal-resnet18
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from memplan.profile import save_profile
from memplan.torch.profiler.model import profile_model

OUT_DIR = Path(__file__).resolve().parent.parent / "memplan" / "profiles"

IMAGE = (3, 224, 224)
# file stem -> (model name, batch size, input shape of one sample, GPU to estimate for or None)
PROFILES: dict[str, tuple[str, int, tuple[int, ...] | None, str | None]] = {
    # Measured on this machine (CPU), batch sizes that profile in minutes.
    "resnet18": ("resnet18", 16, IMAGE, None),
    "resnet50": ("resnet50", 16, IMAGE, None),
    "resnet101": ("resnet101", 8, IMAGE, None),
    "resnet152": ("resnet152", 8, IMAGE, None),
    "vgg16": ("vgg16", 8, IMAGE, None),
    "densenet121": ("densenet121", 8, IMAGE, None),
    "gpt-small": ("gpt-small", 1, (512,), None),
    # Hugging Face transformers (the hf extra), measured at small sizes.
    "gpt2": ("hf:gpt2", 1, (128,), None),
    "llama-1b": ("hf:llama-1b", 1, (128,), None),
    "bert-base": ("hf:bert", 8, (128,), None),
    "vit-b-16": ("hf:vit-b-16", 8, IMAGE, None),
    # Estimated for a GPU (docs/estimation.md) at realistic training batch sizes; sizes are measured
    # here, times come from the roofline of the GPU's catalog entry.
    "resnet18@a100": ("resnet18", 64, IMAGE, "a100"),
    "resnet34@a100": ("resnet34", 64, IMAGE, "a100"),
    "resnet50@a100": ("resnet50", 64, IMAGE, "a100"),
    "resnet101@a100": ("resnet101", 64, IMAGE, "a100"),
    "resnet152@a100": ("resnet152", 64, IMAGE, "a100"),
    "densenet121@a100": ("densenet121", 64, IMAGE, "a100"),
    "vgg16@a100": ("vgg16", 64, IMAGE, "a100"),
    "inception_v3@a100": ("inception_v3", 32, (3, 299, 299), "a100"),
    "gpt-small@a100": ("gpt-small", 4, (1024,), "a100"),
    "resnet50@v100": ("resnet50", 64, IMAGE, "v100"),
    "resnet50@h100": ("resnet50", 64, IMAGE, "h100"),
    "gpt-small@v100": ("gpt-small", 4, (1024,), "v100"),
    "gpt-small@h100": ("gpt-small", 4, (1024,), "h100"),
    # Hugging Face transformers at training sizes, estimated in bfloat16 (DTYPES).
    # Batch sizes kept small while the sizes are measured with real tensors on the CPU (an hour
    # or more each on two loaded cores); raise them once --estimate uses fake tensors.
    "gpt2@a100": ("hf:gpt2", 4, (1024,), "a100"),
    "gpt2@h100": ("hf:gpt2", 4, (1024,), "h100"),
    "llama-1b@a100": ("hf:llama-1b", 1, (2048,), "a100"),
    "llama-1b@h100": ("hf:llama-1b", 1, (2048,), "h100"),
    "bert-base@a100": ("hf:bert", 8, (512,), "a100"),
    "bert-base@h100": ("hf:bert", 8, (512,), "h100"),
    "vit-b-16@a100": ("hf:vit-b-16", 16, IMAGE, "a100"),
    "vit-b-16@h100": ("hf:vit-b-16", 16, IMAGE, "h100"),
    # Join networks (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A 2020; docs/join.md), measured on this machine; their factories give
    # the inputs (images 3x224x224, 64 tokens). Run with --threads 1.
    "siamese-resnet18": ("siamese-resnet18", 8, None, None),
    "cross-modal-resnet18": ("cross-modal-resnet18", 8, None, None),
}
REPEATS = 3
DTYPES: dict[str, str] = {
    stem: "bfloat16"
    for stem, (model, _, _, gpu) in PROFILES.items()
    if model.startswith("hf:") and gpu
}
"""Profiles made in another data type than float32 (the transformers estimated for a GPU)."""
CONFIGS: dict[str, str] = {
    **{f"gpt2@{gpu}": "attn_pdrop=0.0" for gpu in ("a100", "h100")},
    **{f"bert-base@{gpu}": "attention_probs_dropout_prob=0.0" for gpu in ("a100", "h100")},
}
"""Config values of the hf: models estimated for a GPU. Their attention dropout is off: PyTorch's
CPU SDPA has no fused kernel with dropout, so the math kernel would save the batch x heads x seq x
seq attention weights, which the GPU's flash kernel does not (it applies the dropout without
saving anything); without dropout the CPU takes its flash kernel, which saves what the GPU's does.
(Llama and ViT have no attention dropout.)"""


ON_FAKE_TENSORS = {"llama-1b@a100", "llama-1b@h100"}
"""Estimated profiles whose sizes come from fake tensors (``--estimate`` with ``--device auto``,
memplan.torch.measure.fake): the same sizes as real CPU tensors, overheads at the tensor level. A 1 B model
at 2048 tokens in bfloat16 takes hours on two CPU cores with real tensors, seconds with fake ones."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="profiles to make (default: all)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed iterations per stage")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output directory")
    parser.add_argument("--list", action="store_true", help="list the profiles and exit")
    args = parser.parse_args(argv)
    if args.list:
        for stem, (model, batch, shape, gpu) in PROFILES.items():
            where = f"estimated for {gpu}" if gpu else "measured"
            dims = "x".join(map(str, shape)) if shape else "from its factory"
            dtype = DTYPES.get(stem, "float32")
            config = f" --config {CONFIGS[stem]}" if stem in CONFIGS else ""
            print(f"{stem}: {model}{config}, batch {batch}, input {dims}, {dtype}, {where}")
        return 0
    unknown = [name for name in args.names if name not in PROFILES]
    if unknown:
        parser.error(f"unknown profiles {', '.join(unknown)}; choose from {', '.join(PROFILES)}")
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for stem in args.names or list(PROFILES):
        model, batch, shape, gpu = PROFILES[stem]
        began = time.perf_counter()

        def progress(stage: str, done: int, total: int, stem: str = stem) -> None:
            print(f"  {stem}: {done}/{total} {stage}", file=sys.stderr, flush=True)

        prof = profile_model(
            model,
            batch_size=batch,
            input_shape=shape,
            device="auto" if stem in ON_FAKE_TENSORS else "cpu",
            dtype=DTYPES.get(stem, "float32"),
            config=CONFIGS.get(stem),
            repeats=args.repeats,  # ignored when estimating
            estimate=gpu,
            progress=progress,
            threads=args.threads,
        )
        path = args.out / f"{stem}.yaml"
        save_profile(prof, path)
        print(
            f"{stem}: {prof.length} stages, batch {batch}, {prof.dtype}, "
            f"iteration {prof.lower_bound:.1f} ms, "
            f"{time.perf_counter() - began:.0f} s -> {path}",
            flush=True,
        )
    print(f"total {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
