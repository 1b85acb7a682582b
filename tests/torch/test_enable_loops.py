"""memplan.torch.enable in the loops people train with: DDP (gloo, CPU), transformers.Trainer,
Lightning; and the memory of a store-all plan against plain training's.

Each loop trains a few steps under a plan that recomputes next to the same loop training an
identical copy plainly; the parameters after the steps are compared. The recipes are those of
docs/runtime.md ("Training loops").
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import memplan  # noqa: E402
from memplan.api import describe  # noqa: E402
from memplan.torch import (  # noqa: E402
    build_model,
    checkpointed,
    enable,
    linearize,
    planned,
    profile_model,
)
from memplan.torch.measure.step import measure_step  # noqa: E402
from tests.torch.ranks import free_port, run_ranks  # noqa: E402

pytestmark = pytest.mark.torch

HERE = Path(__file__).parent
VOCAB = 100


def _assert_same(ref: nn.Module, got: nn.Module) -> None:
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        torch.testing.assert_close(q, p, msg=lambda m, n=name: f"{n}: {m}")


def _tiny_gpt2(dropout: float = 0.1):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=3, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
        eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _least(prof) -> int:
    """SGD's least memory as ``enable`` plans a first step (the output the caller's)."""
    return memplan.solve(prof, "rotor", 1, optimizer="sgd", output_held=True).min_memory


@pytest.mark.slow
def test_ddp_gloo_on_cpu(tmp_path):
    """Two ranks, DDP over gloo: a model under a plan trains as plain DDP does (the worker
    compares them on every rank)."""
    port = free_port()
    outs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    run_ranks(HERE / "ddp_worker.py", 2, lambda rank: ["2", port, outs[rank]])
    for out in outs:
        diffs = json.loads(out.read_text())
        assert set(diffs) == {"gpt-tiny", "blocks"}
        assert all(diff < 1e-5 for diff in diffs.values()), diffs


def _token_dataset(n: int = 12, seq: int = 16) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (seq,), generator=gen)
        rows.append({"input_ids": ids, "labels": torch.randint(0, VOCAB, (seq,), generator=gen)})
    return rows


@pytest.mark.slow
def test_transformers_trainer(tmp_path):
    """The recipe: ``model = memplan.torch.enable(model, memory, example_input=batch)``, then
    ``Trainer(model=model, ...)`` as usual. A few Trainer steps of a tiny GPT-2 under a plan that
    recomputes give plain Trainer's parameters."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    model = _tiny_gpt2()
    data = _token_dataset()
    batch = transformers.default_data_collator(data[:2])
    prof = profile_model(copy.deepcopy(model), example_input=batch["input_ids"], repeats=1)
    results = []
    for under_plan in (False, True):
        m = copy.deepcopy(model)
        if under_plan:
            # Trainer steps AdamW (PyTorch's default step: named, planned for) and keeps only
            # the loss of the model's output (enable's docstring: output_held=False)
            least = memplan.solve(prof, "rotor", 1, optimizer="adamw").min_memory
            m = enable(
                m, least, example_input=batch, profile=prof, optimizer="adamw", output_held=False
            )
            assert sum(planned(m).planned_forward_counts()) > prof.length
        else:
            m.config.use_cache = False
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / str(under_plan)), max_steps=3, per_device_train_batch_size=2,
            learning_rate=1e-2, use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
        )  # fmt: skip
        trainer = transformers.Trainer(model=m, args=args, train_dataset=data)
        trainer.train()
        results.append(trainer.model)
    assert planned(results[1]) is not None and planned(results[1]).counters.backwards[0] == 1
    _assert_same(*results)


@pytest.mark.slow
def test_lightning(tmp_path):
    """The recipe: enable the model, then use it inside a LightningModule as usual."""
    lightning = pytest.importorskip("lightning")
    model = _tiny_gpt2()
    data = _token_dataset(8)
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    batch = next(iter(loader))
    prof = profile_model(copy.deepcopy(model), example_input=batch["input_ids"], repeats=1)

    class LitLM(lightning.LightningModule):
        def __init__(self, lm: nn.Module) -> None:
            super().__init__()
            self.lm = lm

        def training_step(self, batch, batch_idx):
            return self.lm(**batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trained = []
    for under_plan in (False, True):
        m = copy.deepcopy(model)
        m.config.use_cache = False
        if under_plan:
            # Lightning's training_step returns the loss: no output held; it zeroes the
            # gradients after the forward (in its closure, before the backward), so a step's
            # forward runs with the last step's gradients: the loop enable sees is "kept"
            least = memplan.solve(prof, "rotor", 1, optimizer="sgd", gradients="kept").min_memory
            m = enable(
                m, least, example_input=batch, profile=prof, optimizer="sgd", output_held=False
            )
        lightning.seed_everything(0, verbose=False)
        trainer = lightning.Trainer(
            max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=str(tmp_path),
        )  # fmt: skip
        trainer.fit(LitLM(m), loader)
        trained.append(m)
    assert planned(trained[1]).counters.backwards == [1] * prof.length
    _assert_same(*trained)


# ------------------------------------------------------------------------------------------------
# A store-all plan holds what plain training holds
# ------------------------------------------------------------------------------------------------


class _Loss(nn.Module):
    """One training step's forward as ``measure_step`` calls it: ``step(x)`` is the loss."""

    def __init__(self, model: nn.Module, hf: bool) -> None:
        super().__init__()
        self.model = model
        self.hf = hf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hf:
            return self.model(input_ids=x, labels=x).loss
        return nn.functional.cross_entropy(self.model(x).reshape(-1, VOCAB), x.reshape(-1))


def _peak(step: nn.Module, x: torch.Tensor) -> int:
    opt = torch.optim.SGD(step.parameters(), lr=0.01)
    return max(measure_step(step, x, opt).peak for _ in range(2))


def test_store_all_plan_measures_plain_trainings_peak():
    """Under a plan that stores everything, the allocator's peak of a whole step equals plain
    training's within 1%: the runtime holds nothing plain training does not (the logits are
    freed after the loss's forward, as autograd frees them)."""
    torch.set_num_threads(1)
    model = _tiny_gpt2(dropout=0.0)
    ids = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))
    prof = profile_model(copy.deepcopy(model), example_input=ids, repeats=1)
    store_all = memplan.solve(
        prof, "store-all", 2**50, optimizer="sgd", output_held=True
    ).peak_memory
    plain = copy.deepcopy(model).train()
    plain.config.use_cache = False
    got = enable(
        copy.deepcopy(model).train(), store_all, example_input=ids, profile=prof, optimizer="sgd"
    )
    assert planned(got).planned_forward_counts() == [1] * prof.length
    hooks = (_peak(_Loss(plain, True), ids), _peak(_Loss(got, True), ids))
    # The chain of a model memplan cuts by its stages, run by checkpointed (the loss in the
    # chain) and by enable (the loss the caller's).
    gpt, x, _ = build_model("gpt-tiny", batch_size=4, input_shape=(32,))
    gprof = profile_model(copy.deepcopy(gpt), example_input=x, repeats=1)
    sched = memplan.solve(gprof, "rotor", describe(gprof)["store_all_memory"])
    chain = linearize(copy.deepcopy(gpt).train(), x)

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stages = nn.ModuleList(chain.modules)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return chain.forward(x)

    wrapped = checkpointed(linearize(copy.deepcopy(gpt).train(), x), sched)
    chained = (_peak(Plain(), x), _peak(wrapped, x))
    plain_gpt = copy.deepcopy(gpt).train()
    top = memplan.solve(gprof, "store-all", 2**50, optimizer="sgd", output_held=True).peak_memory
    enabled = enable(copy.deepcopy(gpt).train(), top,
                     example_input=x, profile=gprof, optimizer="sgd")  # fmt: skip
    VOCAB_GPT = 128
    loss = nn.CrossEntropyLoss()

    class Step(nn.Module):
        def __init__(self, m: nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return loss(self.m(x).reshape(-1, VOCAB_GPT), x.reshape(-1))

    stages = (_peak(Step(plain_gpt), x), _peak(Step(enabled), x))
    for name, (want, measured) in {"hooks": hooks, "chain": chained, "stages": stages}.items():
        assert abs(measured - want) <= 0.01 * want, (name, want, measured)
