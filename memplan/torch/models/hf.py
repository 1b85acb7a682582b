"""Hugging Face ``transformers`` models as memplan chains (the ``hf`` extra).

``memplan profile hf:gpt2`` builds the model from the library's config class with random weights
(nothing is downloaded: the weights' values change neither memory nor time), and
:mod:`memplan.torch.split.repeated` cuts it: ``embedding`` (everything before the first block, by the
model's own forward), one stage per decoder or encoder block, ``head`` (final norm and output
layer), then the loss the model's own ``forward`` computes from ``labels``:

* causal LMs (``*ForCausalLM``, ``GPT2LMHeadModel``): ``model.loss_function`` (next-token
  cross-entropy on logits upcast to float32), labels = the input ids;
* masked LMs (``*ForMaskedLM``): cross-entropy over the vocabulary, labels = the input ids at 15%
  of the positions (seed 0), -100 elsewhere;
* image classifiers (``*ForImageClassification``): ``model.loss_function``, random labels.

For the profile and the chain API (:func:`memplan.torch.checkpointed`, ``fit``), the blocks'
other inputs (attention masks, rotary position embeddings, position ids) are held by the stage
wrappers (NOTE [ Stage wrappers ] in :mod:`memplan.torch.split.repeated`); the models run with
``use_cache=False`` and without padding (an attention mask with zeros is an input error there:
the masks would differ from batch to batch). :func:`memplan.torch.enable` runs the model's own
forward with each batch's arguments: padding, position ids and labels as the caller gives them.

Encoder-decoders (T5, BART...) are refused: every decoder block reads the encoder's output
(cross-attention) besides the previous block's output, so the model is two chains joined at every
decoder block, and a memplan chain passes one tensor from stage to stage. Treating the encoder's
output as a side input held through the decoder would count it once per stored decoder state in
the chain model (it is one tensor, shared), and its gradient is the sum of every decoder block's:
the plan's memory would not be exact.

``import transformers`` happens only here, when an ``hf:`` model is built or an HF model is
linearized; ``import memplan`` and the CLI's other commands never import it.

Examples
--------
>>> model, x, label = build_hf_model("gpt2", {"n_layer": 2, "n_embd": 64, "n_head": 2},
...                                  batch_size=2, input_shape=(16,))  # doctest: +SKIP
>>> label, tuple(x.shape)                                               # doctest: +SKIP
('hf:gpt2[n_layer=2,n_embd=64,n_head=2]', (2, 16))
"""

from __future__ import annotations

import difflib
import inspect
import os
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.units import parse_config

__all__ = [
    "HF_PRESETS",
    "HFPreset",
    "build_hf_model",
    "hf_example_input",
    "hf_task",
    "import_transformers",
    "quiet_transformers",
    "is_hf_model",
    "loss_output",
    "parse_config",
    "without_kv_cache",
]

HF_HINT = "needs the hf extra: pip install 'memplan[hf]' (Hugging Face transformers)"
IGNORE_INDEX = -100
MASKED_FRACTION = 0.15
TEXT_BATCH = 8
IMAGE_BATCH = 32


@dataclass(frozen=True)
class HFPreset:
    """A named architecture: a ``transformers`` model type, config values, the task head.

    Attributes
    ----------
    model_type : str
        Key of ``transformers.CONFIG_MAPPING`` (``gpt2``, ``llama``, ``bert``, ``vit``).
    config : dict
        Values given to the config class (its defaults for the rest).
    task : str
        ``causal-lm``, ``masked-lm`` or ``image-classification``.
    seq_len : int
        Default sequence length of the example input (text models).
    about : str
        One line for the docs and errors.
    """

    model_type: str
    config: dict[str, Any] = field(default_factory=dict)
    task: str = "causal-lm"
    seq_len: int = 1024
    about: str = ""


_LLAMA_32_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}

HF_PRESETS: dict[str, HFPreset] = {
    "gpt2": HFPreset("gpt2", {}, "causal-lm", 1024, "GPT-2 small, 124 M (GPT2Config defaults)"),
    "llama": HFPreset(
        "llama", {}, "causal-lm", 2048, "LlamaConfig defaults: Llama-2-7B sizes, 6.7 B"
    ),
    "llama-1b": HFPreset(
        "llama", _LLAMA_32_1B, "causal-lm", 2048, "Llama-3.2-1B sizes, 1.24 B, tied embeddings"
    ),
    "bert": HFPreset("bert", {}, "masked-lm", 512, "BERT-base, 110 M, masked-LM head"),
    "bert-base-uncased": HFPreset("bert", {}, "masked-lm", 512, "the same as bert"),
    "vit": HFPreset(
        "vit", {"num_labels": 1000}, "image-classification", 0, "ViT-B/16 at 224x224, 86 M"
    ),
    "vit-b-16": HFPreset("vit", {"num_labels": 1000}, "image-classification", 0, "as vit"),
}
"""The ``hf:NAME`` presets; any other ``transformers`` model type works too (``hf:mistral``)."""

_TASK_SUFFIXES = {
    "causal-lm": ("ForCausalLM", "LMHeadModel"),
    "masked-lm": ("ForMaskedLM",),
    "image-classification": ("ForImageClassification",),
}


def import_transformers() -> Any:
    """``import transformers``, or an input error naming the ``hf`` extra when it is missing."""
    try:
        import transformers  # local: the optional hf extra, imported only for an hf: model
    except ImportError:
        raise InputError(f"hf: models {HF_HINT}") from None
    return transformers


def is_hf_model(model: object) -> bool:
    """Whether ``model`` is a ``transformers.PreTrainedModel`` (without importing transformers)."""
    module = sys.modules.get("transformers")
    return module is not None and isinstance(model, module.PreTrainedModel)


def hf_task(model: nn.Module) -> str | None:
    name = type(model).__name__
    for task, suffixes in _TASK_SUFFIXES.items():
        if name.endswith(suffixes):
            return task
    return None


def without_kv_cache(model: nn.Module) -> None:
    """Turn a model's key-value cache off in its config and its sub-configs (a multimodal
    model's language model reads its ``text_config``): a cache is for generation, and in training
    it grows at every call of a block, recomputations included (HF's checkpointing turns it off
    too).
    """
    config = getattr(model, "config", None)
    seen: set[int] = set()
    todo = [config]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if getattr(current, "use_cache", False):
            current.use_cache = False
        for key in list(getattr(current, "__dict__", {})):
            if key.endswith("_config") and hasattr(getattr(current, key), "use_cache"):
                todo.append(getattr(current, key))


def loss_output(model: nn.Module, loss: Tensor) -> Any:
    """What an HF language model returns for a step whose loss was computed in chunks of tokens
    (:mod:`memplan.torch.split.chunked_loss`): its output class with the ``loss`` and no
    ``logits`` (None: they are never whole).
    """
    from transformers import modeling_outputs  # local: the optional hf extra

    if hf_task(model) == "masked-lm":
        return modeling_outputs.MaskedLMOutput(loss=loss)
    return modeling_outputs.CausalLMOutputWithPast(loss=loss)


def _config_class_kwargs(config_class: type, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Validate override names against the config class (its fields, aliases and __init__)."""
    default = config_class()
    aliases = dict(getattr(config_class, "attribute_map", {}) or {})
    accepted = (
        set(default.to_dict()) | set(aliases) | set(inspect.signature(config_class).parameters)
    )
    for key in overrides:
        known = key in accepted or isinstance(getattr(type(default), key, None), property)
        if not known or key.startswith("_"):
            close = difflib.get_close_matches(key, sorted(accepted), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InputError(f"--config {key}: {config_class.__name__} has no field {key!r}{hint}")
    return dict(overrides)


@contextmanager
def quiet_transformers(transformers: Any) -> Any:
    """Silence transformers' warnings (e.g. on token ids of a shrunk vocabulary) while building."""
    logging = transformers.utils.logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _model_class(transformers: Any, model_type: str, task: str | None) -> tuple[Any, str]:
    from transformers.models.auto import modeling_auto as auto  # local: the optional hf extra

    mappings = {
        "causal-lm": (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, transformers.AutoModelForCausalLM),
        "masked-lm": (auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, transformers.AutoModelForMaskedLM),
        "image-classification": (
            auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
            transformers.AutoModelForImageClassification,
        ),
    }
    if task is not None:
        return mappings[task][1], task
    causal, masked = mappings["causal-lm"][0], mappings["masked-lm"][0]
    if model_type in masked:  # encoders (BERT, RoBERTa) also have a causal head: prefer MLM
        return mappings["masked-lm"][1], "masked-lm"
    if model_type in causal:
        return mappings["causal-lm"][1], "causal-lm"
    if model_type in mappings["image-classification"][0]:
        return mappings["image-classification"][1], "image-classification"
    raise InputError(
        f"hf:{model_type}: memplan profiles causal LMs, masked LMs and image classifiers; "
        f"transformers has none of these heads for {model_type!r}"
    )


def _label(name: str, overrides: Mapping[str, Any]) -> str:
    if not overrides:
        return f"hf:{name}"
    items = ",".join(f"{k}={v}" for k, v in overrides.items())
    return f"hf:{name}[{items}]"


def build_hf_model(
    name: str,
    config: str | Mapping[str, Any] | None = None,
    *,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    seed: int = 0,
) -> tuple[nn.Module, Tensor, str]:
    """Build an HF model from its config class (random weights) and an example input.

    Parameters
    ----------
    name : str
        A preset of :data:`HF_PRESETS` (``gpt2``, ``llama-1b``, ``bert``, ``vit``...) or any model
        type of ``transformers.CONFIG_MAPPING`` (``mistral``, ``qwen2``, ``roberta``...), with or
        without the ``hf:`` prefix.
    config : str or mapping, optional
        Config values overriding the preset's (``"n_layer=24,n_embd=1024"``); names are checked
        against the config class, aliases such as ``num_hidden_layers`` included.
    batch_size : int, optional
        Default 8 for text, 32 for images.
    input_shape : tuple of int, optional
        ``(seq,)`` for text (default: the preset's sequence length, at most the model's
        positions), ``(channels, height, width)`` for images (default: the config's).
    seed : int
        Seed of the weight initialisation (the global RNG state is left untouched).

    Returns
    -------
    tuple
        ``(model, example_input, label)``; the label (``hf:gpt2[n_layer=24]``) names the profile.

    Raises
    ------
    InputError
        transformers missing, an unknown name or config field, an encoder-decoder, a model whose
        float32 weights would not fit in this machine's memory, or a bad input shape.
    """
    transformers = import_transformers()
    key = name.removeprefix("hf:")
    preset = HF_PRESETS.get(key)
    model_type = preset.model_type if preset else key
    if model_type not in transformers.CONFIG_MAPPING:
        close = difflib.get_close_matches(key, [*HF_PRESETS, *transformers.CONFIG_MAPPING], n=3)
        hint = f" (did you mean {', '.join('hf:' + c for c in close)}?)" if close else ""
        raise InputError(
            f"unknown model hf:{key}{hint}; presets: {', '.join(HF_PRESETS)}, or any "
            "transformers model type such as hf:mistral"
        )
    config_class = transformers.CONFIG_MAPPING[model_type]
    overrides = parse_config(config)
    kwargs = {**(preset.config if preset else {}), **_config_class_kwargs(config_class, overrides)}
    with quiet_transformers(transformers):
        try:
            cfg = config_class(**kwargs)
        except (TypeError, ValueError) as exc:
            raise InputError(f"hf:{key} --config: {' '.join(str(exc).split())}") from None
        if getattr(cfg, "is_encoder_decoder", False):
            raise InputError(
                f"hf:{key} is an encoder-decoder: every decoder block reads the encoder's output "
                "(cross-attention) besides the previous block's output, so the model is not one "
                "chain, and a memplan chain passes one tensor from stage to stage; profile a "
                "decoder-only or encoder-only model"
            )
        cfg.use_cache = False
        model_class, task = _model_class(transformers, model_type, preset.task if preset else None)
        with torch.device("meta"):
            meta = model_class.from_config(cfg)
        params = sum(p.numel() for p in meta.parameters())
        del meta
        memory = _physical_memory()
        if memory is not None and params * 4 > 0.8 * memory:
            raise InputError(
                f"hf:{key} has {params / 1e9:.2f} B parameters ({params * 4 / 2**30:.1f} GiB in "
                f"float32) and this machine has {memory / 2**30:.1f} GiB: shrink it with "
                "--config (e.g. num_hidden_layers=2)"
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = model_class.from_config(cfg)
    without_kv_cache(model)
    default_seq = preset.seq_len if preset else 1024
    x = hf_example_input(model, batch_size, input_shape, default_seq=default_seq)
    return model, x, _label(key, overrides)


def _positions(config: Any) -> int | None:
    for attr in ("max_position_embeddings", "n_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def hf_example_input(
    model: nn.Module,
    batch_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    *,
    default_seq: int = 1024,
) -> Tensor:
    """Random token ids ``(batch, seq)`` or images ``(batch, C, H, W)`` for an HF model (seed 0)."""
    config = model.config
    generator = torch.Generator().manual_seed(0)
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        size = getattr(config, "image_size", 224)
        size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        shape = input_shape or (getattr(config, "num_channels", 3), *size)
        if len(shape) != 3:
            raise InputError(
                f"input shape {','.join(map(str, shape))}: an image model takes C,H,W, "
                f"e.g. {getattr(config, 'num_channels', 3)},{size[0]},{size[1]}"
            )
        batch = IMAGE_BATCH if batch_size is None else batch_size
        return torch.randn((batch, *shape), generator=generator)
    positions = _positions(config)
    if input_shape is None:
        seq = default_seq if positions is None else min(default_seq, positions)
    elif len(input_shape) == 1:
        seq = input_shape[0]
    else:
        raise InputError(
            f"input shape {','.join(map(str, input_shape))}: a transformer takes (seq,), "
            f"e.g. {default_seq}"
        )
    if positions is not None and not 1 <= seq <= positions:
        raise InputError(
            f"input shape {seq}: sequence length must be 1..{positions} "
            "(the model's max_position_embeddings)"
        )
    batch = TEXT_BATCH if batch_size is None else batch_size
    return torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
