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

from benchmarks.sweep_models import (  # noqa: E402
    NOT_PLAIN,
    REFUSED,
    TRAINS,
    Verdict,
    check_type,
    merge,
)

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
