"""The model sweep's sample (benchmarks/sweep_models.py, docs/models.md): a tiny model of each
structure a user brings trains under ``memplan.torch.enable`` at 0.8x plain training's measured
peak, equal to plain training (AdamW, different batches, the same random draws) and within the
budget, by the allocator's own count.

The types cover tied and untied heads (GPT-2, Llama), a mixture-of-experts router (Mixtral),
sliding-window attention (Mistral), hybrid attention with soft-capped logits (Gemma-2: a head
that is tensor code), a vision tower a text batch never reaches (Gemma-3: weights in no stage), ALiBi (BLOOM), rotary embeddings (Llama), a state-space model (Mamba), a
post-norm encoder (BERT, masked LM), an encoder-decoder whose decoder blocks read the
encoder's output (BART) and image classifiers (ViT, ResNet). The sweep over every
type of the installed transformers is the benchmark.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import benchmarks.sweep_models as sweep  # noqa: E402
from benchmarks.sweep_models import (  # noqa: E402
    NOT_PLAIN,
    REFUSED,
    TRAINS,
    Verdict,
    advised,
    check_type,
    merge,
    table,
)
from memplan.errors import InputError  # noqa: E402

pytestmark = pytest.mark.torch

SAMPLE = [
    ("gpt2", "causal-lm"),  # tied head, learned positions
    ("llama", "causal-lm"),  # untied head, rotary, grouped-query attention
    ("mixtral", "causal-lm"),  # mixture-of-experts router
    ("mistral", "causal-lm"),  # sliding-window attention
    ("gemma2", "causal-lm"),  # hybrid sliding/global attention, soft-capped logits
    ("gemma3", "causal-lm"),  # a vision tower the text batch never reaches (in no stage)
    ("bloom", "causal-lm"),  # ALiBi; blocks return their attention weights too
    ("mamba", "causal-lm"),  # state-space blocks
    ("bert", "masked-lm"),  # post-norm encoder
    ("mpnet", "masked-lm"),  # a learned position bias every block reads (its gradient summed)
    ("bart", "masked-lm"),  # an encoder-decoder: the decoder blocks read the encoder's output
    ("vit", "image-classification"),  # class token, x[:, 0] before the classifier
    ("resnet", "image-classification"),  # convolutions, pooling, batch norm
]


@pytest.mark.parametrize(("model_type", "task"), SAMPLE)
def test_a_tiny_model_of_each_structure_trains_under_a_plan(model_type, task):
    found = check_type(model_type, task, steps=2)
    assert found.verdict != NOT_PLAIN, found.reason  # the sample must stay buildable
    assert found.verdict == TRAINS, (found.reason, found)
    assert found.measured_peak is not None and found.budget is not None
    assert found.measured_peak <= found.budget < found.plain_peak
    assert found.recomputed, "a budget below plain training's peak: the plan recomputes"


def test_runs_over_parts_of_the_types_merge_into_one_document(tmp_path):
    # the sweep run side by side (--types split): one table, every run's load, counts of all
    def run(name: str, load: str, *verdicts: Verdict) -> object:
        path = tmp_path / name
        doc = {
            "header": {"transformers": "5", "load": load},
            "results": [vars(v) for v in verdicts],
        }
        path.write_text(json.dumps(doc))
        return path

    a = run("a.json", "1.0", Verdict("gpt2", "causal-lm", TRAINS))
    b = run(
        "b.json", "2.0", Verdict("xlm", "causal-lm", REFUSED), Verdict("bert", "masked-lm", TRAINS)
    )
    doc = merge([a, b])
    assert [r["model_type"] for r in doc["results"]] == ["gpt2", "xlm", "bert"]
    assert doc["header"]["load"] == "1.0; 2.0"
    assert doc["summary"]["causal-lm"][TRAINS] == 1 and doc["summary"]["causal-lm"][REFUSED] == 1
    assert doc["summary"]["masked-lm"][TRAINS] == 1


NO_PLAN = (
    "no rotor plan fits in 800 bytes; the least memory that fits is 900 bytes, counting the "
    "optimizer adamw:fused, the gradients at-backward"
)
CHUNKS_HINT = (
    "; its loss in chunks of tokens never holds the whole logits and needs less: loss_chunks='auto'"
)
CUT_HINT = (
    "; its blocks cut into the residual sub-blocks they run in sequence (attention, MLP) may "
    "fit in less: sub_blocks=True"
)

STEP_HINT = (
    "; the optimizer stepped in the backward, each gradient freed as it is made, fits (for a loop "
    "that neither clips, scales nor accumulates gradients): gradients='step-in-backward', "
    "optimizer=<the optimizer the loop steps>"
)


def test_the_sweep_takes_the_options_a_refusal_for_lack_of_a_plan_advises():
    assert advised(NO_PLAN, {}) == {}
    assert advised(NO_PLAN + CHUNKS_HINT, {}) == {"loss_chunks": "auto"}
    assert advised(NO_PLAN + CHUNKS_HINT + CUT_HINT, {}) == {
        "loss_chunks": "auto",
        "sub_blocks": "auto",
    }
    assert advised(NO_PLAN + CHUNKS_HINT + CUT_HINT, {"loss_chunks": "auto"}) == {
        "sub_blocks": "auto"
    }
    assert advised(NO_PLAN + STEP_HINT, {}) == {"gradients": "step-in-backward"}
    # a refusal for another reason advises nothing the sweep takes, whatever it names
    assert advised("enable: not a chain of blocks; loss_chunks='auto'", {}) == {}


class _Enable:
    """A stand-in for the sweep's ``enable``: refuses, for lack of a plan, below ``least[options]``
    of the budget (bytes), with the hints ``hints[options]``; records each call.
    """

    def __init__(self, least, hints):
        self.least, self.hints, self.calls = least, hints, []

    def __call__(self, model, batch, budget, options, opt):
        key = tuple(sorted(options))
        self.calls.append((budget, dict(options)))
        if budget < self.least[key]:
            raise InputError(f"no rotor plan fits in {budget} bytes" + self.hints.get(key, ""))


@pytest.mark.parametrize(
    ("least", "fraction", "options", "calls"),
    [
        # trains at 0.8 once it takes both pieces of advice, one after the other (each message
        # advises what the options taken leave)
        ({(): 95, ("loss_chunks",): 85, ("loss_chunks", "sub_blocks"): 75}, 0.8, 2, 3),
        # the advice at 0.8 is not enough; at 0.95 plainly first, then as advised
        ({(): 99, ("loss_chunks",): 97, ("loss_chunks", "sub_blocks"): 90}, 0.95, 2, 6),
        # at 0.95 it needs no option
        ({(): 90, ("loss_chunks",): 85, ("loss_chunks", "sub_blocks"): 85}, 0.95, 0, 4),
        # no advice needed: one call
        ({(): 70}, 0.8, 0, 1),
    ],
)
def test_a_refused_type_is_enabled_again_as_its_message_advises(
    monkeypatch, least, fraction, options, calls
):
    hints = {(): CHUNKS_HINT, ("loss_chunks",): CUT_HINT}
    fake = _Enable(least, hints)
    monkeypatch.setattr(sweep, "_enable", fake)
    found = Verdict("x", "causal-lm", "failed", plain_peak=100)
    assert sweep._plan_below(found, None, None, {}, (0.8, 0.95)) is None
    assert found.fraction == fraction and found.budget == int(fraction * 100)
    assert len(found.options) == options and len(fake.calls) == calls


def test_every_piece_of_advice_in_a_message_is_taken_at_once(monkeypatch):
    fake = _Enable({(): 95, ("loss_chunks", "sub_blocks"): 75}, {(): CHUNKS_HINT + CUT_HINT})
    monkeypatch.setattr(sweep, "_enable", fake)
    found = Verdict("x", "causal-lm", "failed", plain_peak=100)
    assert sweep._plan_below(found, None, None, {}, (0.8, 0.95)) is None
    assert fake.calls == [(80, {}), (80, {"loss_chunks": "auto", "sub_blocks": "auto"})]


def test_a_type_without_a_plan_after_the_advice_is_refused_with_the_last_message(monkeypatch):
    fake = _Enable({(): 200, ("loss_chunks",): 200}, {(): CHUNKS_HINT})
    monkeypatch.setattr(sweep, "_enable", fake)
    found = Verdict("x", "causal-lm", "failed", plain_peak=100)
    verdict, reason = sweep._plan_below(found, None, None, {}, (0.8, 0.95))
    assert verdict == REFUSED and reason == "no rotor plan fits in 95 bytes"  # no hint left
    assert found.options == {"loss_chunks": "auto"} and found.fraction == 0.95
    assert fake.calls == [
        (80, {}),
        (80, {"loss_chunks": "auto"}),
        (95, {}),
        (95, {"loss_chunks": "auto"}),
    ]


def test_a_type_trains_with_the_options_its_refusal_advised():
    """Tiny Llama at 0.68 of plain training's peak: below the least memory of whole blocks (about
    0.76) and of the chunked loss alone (0.70); the refusal advises both, and with both (0.66)
    it trains, equal to plain training (the chunked loss returns no logits: the losses and the
    parameters are compared) and within the budget."""
    found = check_type("llama", "causal-lm", steps=2, fraction=0.68, fallback=0.68)
    assert found.verdict == TRAINS, (found.reason, found)
    assert found.options == {"loss_chunks": "auto", "sub_blocks": "auto"}
    assert found.measured_peak is not None and found.budget is not None
    assert found.measured_peak <= found.budget < 0.7 * found.plain_peak


def test_a_classifier_whose_weights_set_the_floor_trains_with_the_step_in_the_backward():
    """A tiny RegNet: its weights, their gradients and AdamW's state leave PyTorch's loop no plan
    below 0.95 of plain training's peak; the refusal advises stepping the optimizer in the
    backward, and so it trains, equal to plain training and within the budget."""
    found = check_type("regnet", "image-classification", steps=2)
    assert found.verdict == TRAINS, (found.reason, found)
    assert found.options == {"gradients": "step-in-backward"}
    assert found.measured_peak is not None and found.budget is not None
    assert found.measured_peak <= found.budget < found.plain_peak


def test_the_table_names_the_options_a_type_needed():
    row = Verdict(
        "llama", "causal-lm", TRAINS, budget=80, fraction=0.8, measured_peak=72, planned_peak=73
    )
    row.options = {"loss_chunks": "auto", "sub_blocks": "auto"}
    header = {"transformers": "5", "torch": "2", "machine": "m", "load": "1", "threads": 1}
    line = table([vars(row)], header).splitlines()[-1]
    assert "| 0.80 | loss_chunks='auto', sub_blocks='auto' | 0.900 | 1.0139 |" in line
