"""memplan under FSDP2 (``fully_shard``) against what FSDP2 users have, on N ranks.

Usage::

    nice -n 10 python benchmarks/bench_fsdp.py                     # two ranks, CPU (gloo)
    nice -n 10 python benchmarks/bench_fsdp.py --model gpt2        # a Hugging Face GPT-2
    nice -n 10 python benchmarks/bench_fsdp.py --model llama-halves  # stages of half blocks
    nice -n 10 python benchmarks/bench_fsdp.py --rounds 7 --json fsdp.json
    nice -n 10 python benchmarks/bench_fsdp.py --model llama --rounds 31 --ways memplan,memplan-chunked
    python benchmarks/bench_fsdp.py --device cuda --out gpu-check  # one rank per GPU (NCCL)

Every rank builds the same model (``--layers`` blocks ``--width`` wide, a vocabulary of
``--vocab``), shards it with FSDP2 (``fully_shard`` per block and on the root) and trains it with
SGD in each way, in turn, one step each per round (paired: each way's step time is divided by
FSDP2 + per-block checkpointing's in the same round, the median of ``--rounds``). ``--model
gpt`` is memplan's zoo GPT, whose caller computes the loss; ``gpt2`` and ``llama`` are Hugging
Face causal language models built from their config classes (no download), whose loss is their
own (``model(**batch).loss``, labels in the batch); ``llama-halves`` is Llama's layers in a model
of one's own whose chain has a stage per half block (the attention and its residual, the MLP and
its: ``memplan_stages``), each half a ``fully_shard`` unit under memplan and under plain FSDP2,
each block one under FSDP2 + checkpoint (the recipe), the caller's loss. The ways:

* **FSDP2**: plain training;
* **FSDP2 + checkpoint**: every block under ``torch.utils.checkpoint.checkpoint(...,
  use_reentrant=False)``, what FSDP2's recipes do: by hand around the zoo GPT's blocks, Hugging
  Face's one-line switch (``gradient_checkpointing_enable``) on its models;
* **FSDP2 + checkpoint + chunked loss** (Hugging Face models): the same, and the head and loss
  computed by hand in ``--loss-chunks`` chunks of tokens, each under ``checkpoint`` (its logits
  made again in the backward), in the model's forward: the best a user writes without memplan;
* **memplan at their peak**: ``memplan.torch.enable(model, budget, example_input=batch,
  optimizer="sgd", output_held=False, shards=N)`` before ``fully_shard``, the budget being the
  per-rank peak FSDP2 + checkpoint measured (the largest over the ranks); the model's own loss,
  and (Hugging Face models) the loss in chunks of tokens (``loss_chunks``);
* **memplan, least memory**: the same at the least per-rank memory memplan plans for, with the
  loss in chunks of tokens on the Hugging Face models (``loss_chunks``: the one-line switch):
  the least of its plans without FSDP2's backward prefetch, which ``enable`` falls back to
  where no plan with it fits (docs/sharding.md; the table says which plans turn it off);
* **sub-blocks** (Hugging Face models): memplan at their peak and at its least with the loss in
  chunks and ``sub_blocks=True``: each block cut into its residual sub-blocks (attention, MLP),
  each a stage, the block one ``fully_shard`` unit spanning them (docs/sharding.md).

Each way's peak is the allocator's count of one measured step after the first (on CPU, c10's
running total with every thread counted: ``allocator_peak.count_every_thread``; on CUDA,
``torch.cuda.max_memory_allocated``), the largest over the ranks. memplan's plans state their
peak (planned); for plain FSDP2 the script gives the per-rank peak NOTE [ FSDP2 memory terms ]
models for a plan that stores everything (modelled): the two columns check the terms against
what FSDP2 allocates. Gradients are not compared here (tests/torch/test_fsdp.py does).
The machine, its load (``uptime``) at the start and the end, the threads, the versions and the
wall time are printed with the table; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import machine

WAYS = (
    "fsdp2", "checkpoint", "checkpoint-chunked", "memplan", "memplan-chunked", "memplan-sub",
    "memplan-least", "memplan-sub-least",
)  # fmt: skip
LABELS = {
    "fsdp2": "FSDP2",
    "checkpoint": "FSDP2 + checkpoint per block",
    "checkpoint-chunked": "FSDP2 + checkpoint per block + chunked loss (by hand)",
    "memplan": "memplan at their peak",
    "memplan-chunked": "memplan at their peak, loss in chunks",
    "memplan-sub": "memplan at their peak, loss in chunks, sub-blocks",
    "memplan-least": "memplan, least memory",
    "memplan-sub-least": "memplan, least memory, sub-blocks",
}
MEMPLAN_WAYS = ("memplan", "memplan-chunked", "memplan-sub", "memplan-least", "memplan-sub-least")
MODELS = ("gpt", "gpt2", "llama", "llama-halves")


def _options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=None, help="default: 2 on CPU, every GPU")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=MODELS, default="gpt")
    parser.add_argument(
        "--loss-chunks", default="auto", help="Hugging Face models: chunks of tokens, or auto"
    )
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4, help="per rank")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--ways",
        default=",".join(WAYS),
        help="the ways to run, comma-separated (FSDP2 + checkpoint, the anchor, always runs)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (CPU)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="a folder for fsdp.json / .md")
    parser.add_argument(
        "--worker", nargs=3, metavar=("RANK", "PORT", "FILE"), help=argparse.SUPPRESS
    )
    options = parser.parse_args(argv)
    unknown = sorted(set(options.ways.split(",")) - set(WAYS))
    if unknown:
        parser.error(f"--ways: no way {', '.join(unknown)} (the ways: {', '.join(WAYS)})")
    return options


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


# ------------------------------------------------------------------------------------------------
# One rank
# ------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One model of the benchmark on one rank: how each way trains it.

    ``batch``: the step's tensors; ``example``: what ``enable`` and the profiler take;
    ``loss(model, batch)``: the step's loss; ``blocks(model)``: its ``fully_shard`` units;
    ``ways``: the baselines, each a function making a fresh copy ready to shard; ``chunks``: the
    chunks of tokens of memplan's loss (None: the caller's loss, no chunks).
    """

    model: Any
    batch: dict[str, Any]
    example: Any
    loss: Callable[[Any, dict[str, Any]], Any]
    blocks: Callable[[Any], Any]
    ways: dict[str, Callable[[Any], Any]]
    chunks: int | None
    text: str


def _zoo_case(options: argparse.Namespace, device: Any, rank: int) -> Case:
    """memplan's zoo GPT; the caller computes the loss; per-block checkpoint by hand."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    from memplan.torch.zoo.gpt import GPT, GPTConfig

    config = GPTConfig(
        vocab_size=options.vocab, seq_len=options.seq, n_layer=options.layers,
        n_head=options.heads, d_model=options.width,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config).to(device).train()
    gen = torch.Generator().manual_seed(1 + rank)
    shape = (options.batch, options.seq)
    x = torch.randint(0, options.vocab, shape, generator=gen).to(device)
    y = torch.randint(0, options.vocab, shape, generator=gen).to(device)

    def loss(model: Any, batch: dict[str, Any]) -> Any:
        logits = model(batch["x"])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["y"].ravel())

    def checkpointed(model: Any) -> Any:  # its class' own forward, every block checkpointed
        def forward(idx: torch.Tensor) -> torch.Tensor:
            h = model.embed(idx)
            for block in model.blocks:
                h = checkpoint(block, h, use_reentrant=False)
            return model.lm_head(model.ln_f(h))

        object.__setattr__(model, "forward", forward)
        return model

    return Case(
        model, {"x": x, "y": y}, x, loss, lambda m: m.blocks,
        {"fsdp2": _copy, "checkpoint": lambda m: checkpointed(_copy(m))}, None,
        "GPT (memplan's zoo; the caller's loss)",
    )  # fmt: skip


def _hf_model(options: argparse.Namespace) -> tuple[Any, Callable[[Any], Any], Callable]:
    """A Hugging Face causal LM from its config class, its blocks, and its body: the last hidden
    state (final norm included) from the batch's tokens."""
    import transformers

    transformers.logging.set_verbosity_error()
    if options.model == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=options.vocab, n_positions=options.seq, n_embd=options.width,
            n_layer=options.layers, n_head=options.heads,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
        return model, lambda m: m.transformer.h, lambda m, ids: m.transformer(input_ids=ids)[0]
    config = transformers.LlamaConfig(
        vocab_size=options.vocab, hidden_size=options.width, intermediate_size=4 * options.width,
        num_hidden_layers=options.layers, num_attention_heads=options.heads,
        num_key_value_heads=options.heads, max_position_embeddings=options.seq,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    return model, lambda m: m.model.layers, lambda m, ids: m.model(input_ids=ids)[0]


def _hand_chunked(model: Any, body: Callable, chunks: int) -> Any:
    """``model`` whose forward computes its causal LM loss by hand: the body, then the head and
    the cross-entropy over ``chunks`` chunks of tokens, each under ``checkpoint`` (its logits
    made again in the backward); in the model's own forward, so FSDP2's root hooks run."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_outputs import CausalLMOutputWithPast

    def chunk_sum(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = model.lm_head(hidden).float()
        flat = logits.reshape(-1, logits.shape[-1])
        return F.cross_entropy(flat, targets.reshape(-1), ignore_index=-100, reduction="sum")

    def forward(input_ids: torch.Tensor, labels: torch.Tensor) -> CausalLMOutputWithPast:
        hidden = body(model, input_ids)
        targets = F.pad(labels, (0, 1), value=-100)[..., 1:]  # as ForCausalLMLoss shifts
        total = hidden.new_zeros((), dtype=torch.float32)
        pieces = zip(hidden.chunk(chunks, 1), targets.chunk(chunks, 1), strict=True)
        for part, part_targets in pieces:
            total = total + checkpoint(chunk_sum, part, part_targets, use_reentrant=False)
        return CausalLMOutputWithPast(loss=total / (targets != -100).sum())

    object.__setattr__(model, "forward", forward)
    return model


def _hf_case(options: argparse.Namespace, device: Any, rank: int) -> Case:
    """A Hugging Face causal LM, its own loss; Hugging Face's one-line checkpointing switch."""
    import torch

    from memplan.torch.split.chunked_loss import resolve_loss_chunks

    torch.manual_seed(0)
    model, blocks, body = _hf_model(options)
    model = model.to(device).train()
    gen = torch.Generator().manual_seed(1 + rank)
    ids = torch.randint(0, options.vocab, (options.batch, options.seq), generator=gen).to(device)
    batch = {"input_ids": ids, "labels": ids.clone()}
    given = options.loss_chunks if options.loss_chunks == "auto" else int(options.loss_chunks)
    chunks = resolve_loss_chunks(given, options.vocab, options.width, ids.numel(), options.seq)
    assert chunks is not None

    def checkpointed(model: Any) -> Any:  # the one-line switch (gradient_... before v5.2)
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return model

    ways = {
        "fsdp2": _copy,
        "checkpoint": lambda m: checkpointed(_copy(m)),
        "checkpoint-chunked": lambda m: _hand_chunked(checkpointed(_copy(m)), body, chunks),
    }
    kind = type(model).__name__
    return Case(
        model, batch, batch, lambda m, b: m(**b).loss, blocks, ways, chunks,
        f"{kind} (Hugging Face, its own loss; in {chunks} chunks of tokens by hand and at memplan's least)",
    )  # fmt: skip


def _halves_case(options: argparse.Namespace, device: Any, rank: int) -> Case:
    """Llama's layers (transformers' modules) in a model of one's own that gives memplan its
    chain at half blocks (``memplan_stages``: the attention and its residual, the MLP and its):
    memplan's ways shard each half as a unit of its own; FSDP2 + checkpoint, the recipe, each
    block; the caller's loss over the whole logits."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Attention(nn.Module):  # x + attn(norm(x)), the rotary embedding made inside
        def __init__(self, layer: Any, rotary: Any) -> None:
            super().__init__()
            self.norm, self.attn, self.rotary = layer.input_layernorm, layer.self_attn, rotary

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            pos = self.rotary(h, positions)
            return h + self.attn(self.norm(h), position_embeddings=pos, attention_mask=None)[0]

    class Mlp(nn.Module):  # x + mlp(norm(x))
        def __init__(self, layer: Any) -> None:
            super().__init__()
            self.norm, self.mlp = layer.post_attention_layernorm, layer.mlp

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + self.mlp(self.norm(h))

    class Halves(nn.Module):
        def __init__(self, hf: Any) -> None:
            super().__init__()
            self.embed = hf.model.embed_tokens
            rotary = hf.model.rotary_emb
            self.blocks = nn.ModuleList(
                nn.Sequential(Attention(layer, rotary), Mlp(layer)) for layer in hf.model.layers
            )
            self.head = nn.Sequential(hf.model.norm, hf.lm_head)
            self.whole = False  # fully_shard units: whole blocks (True) or halves

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.embed(ids)
            for block in self.blocks:
                h = checkpoint(block, h, use_reentrant=False) if self.whole else block(h)
            return self.head(h)

        def units(self) -> list[nn.Module]:
            return list(self.blocks) if self.whole else [m for b in self.blocks for m in b]

        def memplan_stages(self) -> list[tuple[str, nn.Module]]:
            halves = [(f"{i}.{j}", m) for i, b in enumerate(self.blocks) for j, m in enumerate(b)]
            return [("embedding", self.embed), *halves, ("head", self.head)]

    torch.manual_seed(0)
    model = Halves(_hf_model(options)[0]).to(device).train()  # Llama's (not "gpt2")
    gen = torch.Generator().manual_seed(1 + rank)
    ids = torch.randint(0, options.vocab, (options.batch, options.seq), generator=gen).to(device)

    def loss(model: Any, batch: dict[str, Any]) -> Any:
        logits = model(batch["x"])[:, :-1]
        return nn.functional.cross_entropy(logits.reshape(-1, options.vocab), batch["y"].ravel())

    def checkpointed(model: Any) -> Any:  # every block under checkpoint, a unit of its own
        model.whole = True
        return model

    return Case(
        model, {"x": ids, "y": ids[:, 1:]}, ids, loss, lambda m: m.units(),
        {"fsdp2": _copy, "checkpoint": lambda m: checkpointed(_copy(m))}, None,
        "Llama's layers cut at half blocks (the attention, the MLP; the caller's loss)",
    )  # fmt: skip


def _copy(model: Any) -> Any:
    return copy.deepcopy(model)


def _shard(model: Any, blocks: Any) -> Any:
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _rank_figures(
    case: Case, prof: Any, world: int, chunks: int | None, sub_blocks: bool = False
) -> tuple[int, int]:
    """(store-all peak, least memory) of one rank of ``world``, as the terms model them: the
    rank's profile is the one ``enable`` plans with (``shards=world``); the least is that of its
    plans without FSDP2's backward prefetch (``enable``'s last resort)."""
    from memplan.api import describe, schedule_from_sequence, simulate
    from memplan.torch import enable, planned

    options: dict[str, Any] = {"loss_chunks": chunks} if chunks is not None else {}
    options["sub_blocks"] = sub_blocks
    one = enable(
        _copy(case.model), "1TB", example_input=case.example, profile=prof, shards=world,
        optimizer="sgd", output_held=False, **options,
    )  # fmt: skip
    found = planned(one)
    assert found is not None
    rank = found.profile
    length = len(rank.stages or [])
    ops = [("F_all", k) for k in range(length)] + [("B", k) for k in reversed(range(length))]
    plan = schedule_from_sequence(rank, ops, optimizer="sgd", gradients="at-backward")  # type: ignore[arg-type]
    modelled = simulate(rank, plan, check_claims=False).peak_memory
    without = found.sharding.rank_profile(prefetch=False)
    least = min(describe(p, "sgd")["min_memory"]["chain"] for p in (rank, without))
    return modelled, least


def _largest(value: int) -> int:
    """The largest ``value`` over the ranks."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    found = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return int(found.item())


class _Ways:
    """The ways' sharded models and optimizers on one rank, measured and timed alike."""

    def __init__(self, case: Case, device: Any) -> None:
        self.case = case
        self.device = device
        self.models: dict[str, Any] = {}
        self.opts: dict[str, Any] = {}
        self.found: dict[str, Any] = {}

    def add(self, name: str, model: Any) -> None:
        import torch

        self.models[name] = _shard(model, self.case.blocks(model))
        self.opts[name] = torch.optim.SGD(model.parameters(), lr=1e-3)
        self.found.setdefault(name, {})["seconds"] = []

    def step(self, name: str) -> None:  # the gradients were freed before it (zero_grad)
        self.case.loss(self.models[name], self.case.batch).backward()
        self.opts[name].step()

    def measure(self, name: str) -> None:
        import torch.distributed as dist

        from memplan.torch.measure.allocator_peak import allocator_peak

        self.step(name)  # FSDP2's lazy initialization, the first step's allocations: not measured
        self.opts[name].zero_grad()
        model = self.models[name]
        tensors = [*model.parameters(), *model.buffers(), *self.case.batch.values()]
        held = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
        dist.barrier()
        peak, _ = allocator_peak(lambda: self.step(name), held, self.device)
        self.found[name]["peak"] = _largest(peak)
        self.found[name]["rank_peak"] = peak

    def time(self, rounds: int) -> None:
        """``rounds`` rounds, every way's step once per round (paired)."""
        import time

        import torch
        import torch.distributed as dist

        cuda = self.device.type == "cuda"
        for _ in range(rounds):
            for name in self.models:
                dist.barrier()
                if cuda:
                    torch.cuda.synchronize(self.device)
                self.opts[name].zero_grad()
                start = time.perf_counter()
                self.step(name)
                if cuda:
                    torch.cuda.synchronize(self.device)
                self.found[name]["seconds"].append(time.perf_counter() - start)


def _memplan_way(
    ways: _Ways,
    name: str,
    budget: int,
    prof: Any,
    world: int,
    chunks: int | None,
    sub_blocks: bool = False,
) -> None:
    """memplan's plan for ``budget`` per rank: ``enable`` before ``fully_shard`` (one rank of
    ``world``, the loop of :meth:`_Ways.step`, the loss in ``chunks`` chunks of tokens or the
    model's own, its blocks cut into sub-blocks or not), measured."""
    from memplan.errors import InputError
    from memplan.torch import enable, planned

    case = ways.case
    chunked: dict[str, Any] = {} if chunks is None else {"loss_chunks": chunks}
    chunked["sub_blocks"] = sub_blocks
    try:
        under = enable(
            _copy(case.model), budget, example_input=case.example, profile=prof,
            shards=world, optimizer="sgd", output_held=False, **chunked,
        )  # fmt: skip
    except InputError as exc:  # no plan fits: said in the table
        ways.found[name] = {"budget": budget, "peak": None, "error": str(exc), "seconds": []}
        return
    ways.add(name, under)
    ways.measure(name)
    plan = planned(under)
    assert plan is not None
    ways.found[name].update(
        budget=budget,
        planned=plan.schedule.peak_memory,
        forwards=sum(plan.planned_forward_counts()),
        stages=len(plan.names),
        prefetch=plan.sharding.layout.prefetch,
    )


def _rank(rank: int, world: int, options: argparse.Namespace) -> dict[str, Any]:
    import torch

    from memplan.torch import profile_model
    from memplan.torch.split.sub_blocks import cutting_sub_blocks

    device = torch.device("cuda", rank) if options.device == "cuda" else torch.device("cpu")
    cases = {"gpt": _zoo_case, "llama-halves": _halves_case}
    case = cases.get(options.model, _hf_case)(options, device, rank)

    def profile(chunks: int | None, cut: bool = False) -> Any:
        with cutting_sub_blocks(cut):
            return profile_model(
                _copy(case.model), example_input=case.example, repeats=3, loss_chunks=chunks
            )

    prof = profile(None)  # the model's own loss: plain FSDP2's
    modelled, _ = _rank_figures(case, prof, world, None)
    chunked = prof if case.chunks is None else profile(case.chunks)
    _, least = _rank_figures(case, chunked, world, case.chunks)
    chosen = {"checkpoint", *options.ways.split(",")}
    ways = _Ways(case, device)
    for name, make in case.ways.items():
        if name in chosen:
            ways.add(name, make(case.model))
            ways.measure(name)
    if "fsdp2" in ways.found:
        ways.found["fsdp2"]["modelled"] = modelled
    peak = ways.found["checkpoint"]["peak"]
    if "memplan" in chosen:
        _memplan_way(ways, "memplan", peak, prof, world, None)
    if case.chunks is not None and "memplan-chunked" in chosen:  # more room for stored blocks
        _memplan_way(ways, "memplan-chunked", peak, chunked, world, case.chunks)
    if "memplan-least" in chosen:
        _memplan_way(ways, "memplan-least", least, chunked, world, case.chunks)
    if case.chunks is not None and {"memplan-sub", "memplan-sub-least"} & chosen:
        cut = profile(case.chunks, cut=True)  # a Hugging Face model: blocks cut into sub-blocks
        _, cut_least = _rank_figures(case, cut, world, case.chunks, sub_blocks=True)
        if "memplan-sub" in chosen:
            _memplan_way(ways, "memplan-sub", peak, cut, world, case.chunks, sub_blocks=True)
        if "memplan-sub-least" in chosen:
            _memplan_way(
                ways, "memplan-sub-least", cut_least, cut, world, case.chunks, sub_blocks=True
            )
    ways.time(options.rounds)
    return {"text": case.text, "chunks": case.chunks, "ways": ways.found}


def _worker(options: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank, port, out = int(options.worker[0]), options.worker[1], options.worker[2]
    world = int(os.environ["FSDP_WORLD"])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    torch.set_num_threads(options.threads)
    backend = "nccl" if options.device == "cuda" else "gloo"
    if options.device == "cuda":
        torch.cuda.set_device(rank)
    else:
        from memplan.torch.measure.allocator_peak import count_every_thread

        count_every_thread()
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        found = _rank(rank, world, options)
    finally:
        dist.destroy_process_group()
    Path(out).write_text(json.dumps(found))


# ------------------------------------------------------------------------------------------------
# The run and its table
# ------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(options: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Start the ranks (this script with ``argv``, which ``options`` were parsed from), wait for
    them, and gather rank 0's figures with the run's conditions."""
    import tempfile

    import torch

    world = options.ranks or (torch.cuda.device_count() if options.device == "cuda" else 2)
    if options.device == "cuda" and not torch.cuda.is_available():
        print("bench_fsdp: --device cuda needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    port = str(_free_port())
    began, load = time.time(), _uptime()
    with tempfile.TemporaryDirectory() as folder:
        outs = [Path(folder) / f"rank{rank}.json" for rank in range(world)]
        env = {**os.environ, "FSDP_WORLD": str(world), "OMP_NUM_THREADS": str(options.threads)}
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *argv, "--worker", str(rank), port, str(out)], env=env
            )
            for rank, out in enumerate(outs)
        ]
        codes = [proc.wait() for proc in procs]
        if any(codes):
            print(f"bench_fsdp: a rank failed (exit codes {codes})", file=sys.stderr)
            raise SystemExit(1)
        ranks = [json.loads(out.read_text()) for out in outs]
    return {
        "machine": machine(),
        "versions": _versions(),
        "device": options.device,
        "ranks": world,
        "threads": options.threads,
        "load_start": load,
        "load_end": _uptime(),
        "wall_seconds": round(time.time() - began, 1),
        "model": {
            "kind": options.model,
            "text": ranks[0]["text"],
            "loss_chunks": ranks[0]["chunks"],
            "layers": options.layers,
            "width": options.width,
            "heads": options.heads,
            "vocab": options.vocab,
            "seq": options.seq,
            "batch_per_rank": options.batch,
        },  # fmt: skip
        "ways": ranks[0]["ways"],
    }


def _versions() -> str:
    """torch's version, and transformers' when installed."""
    import torch

    found = f"torch {torch.__version__}"
    try:
        import transformers
    except ImportError:
        return found
    return f"{found}, transformers {transformers.__version__}"


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.2f}"


def report(doc: dict[str, Any]) -> str:
    """The markdown table of a run: per-rank peaks and paired step-time ratios."""
    ways = doc["ways"]
    anchor = ways["checkpoint"]
    lines = [
        "| way | per-rank peak MB | / checkpoint | planned or modelled MB | step ms "
        "| time / checkpoint (paired median) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in [n for n in WAYS if n in ways]:
        way = ways[name]
        if way.get("peak") is None:  # no plan fitted its budget
            lines.append(f"| {LABELS[name]} | no plan: {way['error']} | | | | |")
            continue
        ratios = [a / b for a, b in zip(way["seconds"], anchor["seconds"], strict=True)]
        model = way.get("planned", way.get("modelled"))
        lines.append(
            f"| {LABELS[name]} | {_mb(way['peak'])} | {way['peak'] / anchor['peak']:.3f} | "
            f"{_mb(model)} | {1000 * statistics.median(way['seconds']):.0f} | "
            f"{statistics.median(ratios):.3f} |"
        )
    m = doc["model"]
    lines += [
        "",
        f"{m['text']}, {m['layers']} blocks x {m['width']} wide, {m['heads']} heads, "
        f"{m['vocab']} tokens, batch {m['batch_per_rank']} x {m['seq']} per rank; SGD; "
        f"{doc['ranks']} ranks ({doc['device']}), {doc['threads']} thread(s) each. "
        f"{doc['machine']}; {doc['versions']}. Load at start: {doc['load_start']}; at the end: "
        f"{doc['load_end']}; {doc['wall_seconds']} s.",
    ]
    for name, where in (
        ("memplan", "at their peak"),
        ("memplan-chunked", "at their peak with the loss in chunks"),
        ("memplan-sub", "at their peak with sub-blocks"),
        ("memplan-least", "at its least"),
        ("memplan-sub-least", "at its least with sub-blocks"),
    ):
        if "forwards" in ways.get(name, {}):
            lines[-1] += f" memplan recomputes {ways[name]['forwards'] - ways[name]['stages']}"
            lines[-1] += f" forwards {where}"
            lines[-1] += "." if ways[name].get("prefetch", True) else ", backward prefetch off."
    return "\n".join(lines)


def check(argv: list[str]) -> int:
    """Run the benchmark with ``argv`` (its command line), print and write its table; 1 when a
    plan measured above its budget."""
    options = _options(argv)
    doc = run(options, argv)
    text = report(doc)
    print(text)
    if options.json is not None:
        options.json.write_text(json.dumps(doc, indent=1))
    if options.out is not None:
        options.out.mkdir(parents=True, exist_ok=True)
        (options.out / "fsdp.json").write_text(json.dumps(doc, indent=1))
        (options.out / "fsdp.md").write_text(text + "\n")
    ways = doc["ways"]
    over = [
        n
        for n in MEMPLAN_WAYS
        if ways.get(n, {}).get("peak") is not None and ways[n]["peak"] > ways[n]["budget"]
    ]
    if over:
        print(f"bench_fsdp: measured above the budget: {', '.join(over)}", file=sys.stderr)
    return 1 if over else 0


def main() -> None:
    options = _options()
    if options.worker:
        _worker(options)
        return
    raise SystemExit(check(sys.argv[1:]))


if __name__ == "__main__":
    main()
