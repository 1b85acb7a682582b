"""One rank of an FSDP2 run (CPU, gloo) of a GPT-style model under memplan's plans, beside plain
FSDP2 training.

Run by tests/torch/test_fsdp.py as ``python tests/torch/fsdp_worker.py RANK WORLD PORT OUT``.
Every rank builds the same small GPT (memplan's zoo: embedding, 4 blocks, head; its caller
computes the loss), profiles it whole, and takes two budgets from the per-rank profile of
:func:`memplan.profile.sharding.shard_profile`: the least memory one rank trains in, and a fifth
of the way from it to what storing everything needs. For each it enables the plan on a copy
*before* ``fully_shard`` (docs/runtime.md: the shard count comes from the process group), shards
it (``fully_shard`` per block and on the root) and trains three steps on different batches,
measuring each step with the allocator's count; a plain copy trains the same steps under FSDP2.
It writes to OUT, per budget: the largest parameter difference with plain training, the budget,
the plan's peak, the measured peaks, the forward computations, FSDP2's collectives per step and
whether a block was left gathered.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from memplan.api import describe
from memplan.profile.sharding import shard_profile
from memplan.torch import enable, linearize, planned, profile_model
from memplan.torch.measure.allocator_peak import allocator_peak, count_every_thread, profiled_copy
from memplan.torch.runtime.fsdp import collective_copies, model_layout
from memplan.torch.zoo.gpt import GPT, GPTConfig
from tests.torch.ranks import gloo_rank

CONFIG = GPTConfig(vocab_size=512, seq_len=128, n_layer=4, n_head=4, d_model=64)
BATCH = 8  # per rank
STEPS = 3


class Collectives:
    """Counts FSDP2's all-gathers and reduce-scatters (its calls into torch.distributed)."""

    def __init__(self) -> None:
        self.counts = {"all_gather": 0, "reduce_scatter": 0}
        for name, key in (
            ("all_gather_single", "all_gather"),
            ("reduce_scatter_single", "reduce_scatter"),
        ):
            original = getattr(dist, name)

            def counted(*args: Any, _original: Any = original, _key: str = key, **kw: Any) -> Any:
                self.counts[_key] += 1
                return _original(*args, **kw)

            setattr(dist, name, counted)

    def take(self) -> dict[str, int]:
        taken, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        return taken


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _shard(model: GPT) -> GPT:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _budgets(model: nn.Module, x: torch.Tensor, world: int) -> tuple[dict[str, int], Any]:
    """The least per-rank memory, and a fifth of the way from it to the store-all need."""
    prof = profile_model(copy.deepcopy(model), example_input=x, repeats=1, name="gpt-fsdp")
    stages = [m for _, m in linearize(model, x).stages[:-1]]
    layout = model_layout(
        [*stages, None], world, set(range(1, len(stages) - 1)), collective_copies(), False
    )
    found = describe(shard_profile(prof, layout), "sgd")
    least, most = found["min_memory"]["chain"], found["store_all_memory"]
    return {"least": least, "fifth": least + (most - least) // 5}, prof


def _train(
    model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], rank: int, counts: Any
) -> dict[str, Any]:
    """``STEPS`` SGD steps, each measured; FSDP2's collectives and gathered blocks after each."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    found: dict[str, Any] = {"peaks": [], "collectives": [], "gathered": []}
    for step, (x, y) in enumerate(batches):
        opt.zero_grad()
        x = profiled_copy(x)

        def train_step(x: torch.Tensor = x, y: torch.Tensor = y) -> None:
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.ravel())
            del logits
            loss.backward()
            opt.step()

        held = [_local(t) for t in [*model.parameters(), *model.buffers(), x, y]]
        torch.manual_seed(10 * step + rank)
        peak, _ = allocator_peak(train_step, held, torch.device("cpu"))
        found["peaks"].append(peak)
        found["collectives"].append(counts.take())
        blocks = model.blocks  # type: ignore[union-attr]
        found["gathered"].append(
            any(not any(hasattr(p, "to_local") for p in b.parameters()) for b in blocks)
        )
    return found


def _run(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = GPT(CONFIG).train()
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
    batches = [
        (
            torch.randint(0, CONFIG.vocab_size, (BATCH, CONFIG.seq_len), generator=gen),
            torch.randint(0, CONFIG.vocab_size, (BATCH, CONFIG.seq_len), generator=gen),
        )
        for _ in range(STEPS)
    ]
    budgets, prof = _budgets(model, batches[0][0], world)
    counts = Collectives()
    plain = _shard(copy.deepcopy(model))
    result: dict[str, Any] = {"plain": _train(plain, batches, rank, counts)}
    for name, budget in budgets.items():
        under = enable(
            copy.deepcopy(model),
            budget,
            example_input=batches[0][0],
            profile=prof,
            optimizer="sgd",
            output_held=False,
        )  # the loop of _train; fmt: skip
        trained = _train(_shard(under), batches, rank, counts)
        plan = planned(under)
        assert plan is not None
        trained.update(
            budget=budget,
            planned=plan.schedule.peak_memory,
            shards=plan.profile.extra["shards"]["ranks"],
            forwards=sum(plan.planned_forward_counts()),
            counted=[sum(f.values()) for f in plan.counters.forwards],
            stages=len(plan.names),
            diff=max(
                (_local(p) - _local(q)).abs().max().item()
                for p, q in zip(plain.parameters(), under.parameters(), strict=True)
            ),
        )
        result[name] = trained
    return result


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

    def run() -> dict[str, Any]:
        count_every_thread()  # gloo's worker threads release the collectives' buffers
        return _run(rank, world)

    result = gloo_rank(rank, world, port, run)
    with open(out, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
