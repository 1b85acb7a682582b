"""A tiny model of any Hugging Face ``transformers`` model type, from the type's own config class.

What the model sweep (``benchmarks/sweep_models.py``, docs/models.md) and its sample in the tests
build: the type's config class with its own defaults, shrunk to two layers, 64 wide, a vocabulary
of 1,000 tokens, few experts and small images (:func:`tiny_config`); random weights (a fixed
seed); and a batch of that model's inputs and labels (:func:`tiny_batch`).

NOTE [ Shrinking a config ]
---------------------------
Config classes name the same size many ways (``num_hidden_layers``, ``n_layer``, ``num_layers``;
``hidden_size``, ``n_embd``, ``d_model``...). :func:`tiny_config` sets every name of
:data:`SIZES` the class knows (a field of its defaults, an argument of its constructor or an alias
of its ``attribute_map``) and only those, so the rest of the structure is the type's own:
its norms, its attention variant, its routers. Lists with one entry per layer (``layer_types``,
``mlp_layer_types``..., and the per-layer overrides of a heterogeneous config) keep two layers:
the first, and the first that differs from it if one does (a hybrid model stays hybrid: one
sliding-window and one full-attention layer, one state-space and one attention block); lists with one entry per stage of a vision model
(``depths``, ``hidden_sizes``, ``num_heads``) keep their length with small values. Special token
ids that fall outside the small vocabulary are moved to its last ids, and sub-configs
(``text_config``, ``vision_config``) are shrunk the same way. Some types still need more than
these names say (a size that must divide another): their tiny model does not build, which
the sweep reports as such (not memplan's).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from memplan.torch.models.hf import (
    IGNORE_INDEX,
    MASKED_FRACTION,
    import_transformers,
    quiet_transformers,
    without_kv_cache,
)

__all__ = [
    "SIZES",
    "TASK_MAPPINGS",
    "model_types",
    "tiny_batch",
    "tiny_config",
    "tiny_model",
]

LAYERS = 2
WIDTH = 64
HEADS = 4
HEAD_DIM = WIDTH // HEADS
VOCAB = 1000
SPECIAL_IDS = 16
"""The last ids of the vocabulary, where special tokens are moved (never drawn as input)."""
IMAGE_SIZE = 32
LABELS = 10

SIZES: dict[tuple[str, ...], Any] = {
    # depth
    ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "encoder_layers",
     "num_decoder_layers"): LAYERS,
    # width
    ("hidden_size", "n_embd", "d_model", "dim", "emb_dim", "n_embed", "embedding_size",
     "word_embed_proj_dim", "embedding_dim", "attention_hidden_size"): WIDTH,
    ("intermediate_size", "n_inner", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "d_ff",
     "ffn_hidden_size", "d_inner", "hidden_dim", "mamba_d_ssm", "dff", "dim_ff"): 2 * WIDTH,
    # attention
    ("num_attention_heads", "n_head", "n_heads", "decoder_attention_heads",
     "encoder_attention_heads", "swa_num_attention_heads"): HEADS,
    ("num_key_value_heads", "swa_num_key_value_heads", "multi_query_group_num",
     "num_kv_heads"): 2,
    ("head_dim", "d_head", "dim_head", "attention_head_dim", "kv_channels", "swa_head_dim",
     "v_head_dim", "qk_head_dim", "index_head_dim", "linear_key_head_dim",
     "linear_value_head_dim", "linear_head_dim", "mamba_d_head", "mamba_head_dim",
     "attention_head_size"): HEAD_DIM,
    ("q_lora_rank", "kv_lora_rank"): 32,
    ("d_latents",): WIDTH,  # Perceiver
    ("num_latents",): 16,
    ("num_self_attends_per_block",): LAYERS,
    ("num_blocks",): 1,
    ("num_self_attention_heads",): HEADS,
    ("num_cross_attention_heads",): 1,
    ("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim"): HEAD_DIM // 2,
    ("index_n_heads", "linear_num_key_heads", "linear_num_heads"): 2,
    ("linear_num_value_heads",): HEADS,
    ("sliding_window", "sliding_window_size", "local_attention_window_len",
     "attention_window"): 16,
    ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"): 128,
    # vocabulary
    ("vocab_size", "vocab_size_per_layer_input", "entity_vocab_size", "pronunciation_vocab_size",
     "shape_vocab_size"): VOCAB,
    ("input_embedding_size", "output_embedding_size", "entity_emb_size", "pronunciation_embed_dim",
     "shape_embed_dim"): WIDTH,
    ("hidden_size_per_layer_input",): HEAD_DIM,
    # mixture of experts
    ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"): 4,
    ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k_experts"): 2,
    ("moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size",
     "expert_intermediate_size"): WIDTH,
    ("n_group", "topk_group", "num_expert_group"): 1,
    ("first_k_dense_replace",): 1,
    # state-space blocks
    ("mamba_d_state", "state_size", "ssm_state_size", "d_state"): 16,
    ("n_groups", "mamba_n_groups"): 1,
    ("mamba_dt_rank", "time_step_rank"): 8,
    ("mamba_chunk_size", "chunk_size"): 16,
    # hybrids with one kind of layer every n: both kinds within two layers
    ("attn_layer_period", "expert_layer_period"): 2,
    ("attn_layer_offset", "expert_layer_offset"): 1,
    # images
    ("image_size",): IMAGE_SIZE,
    ("patch_size",): 4,
    ("window_size",): 2,
    ("num_channels",): 3,
    ("embed_dim",): WIDTH // 4,
}  # fmt: skip
"""Config names and their tiny value (NOTE [ Shrinking a config ])."""

PER_STAGE = {"depths": 1, "hidden_sizes": None, "num_heads": None, "embed_dims": None}
"""Lists of a hierarchical vision model, one entry per stage: depth 1, small widths and heads."""

TASK_MAPPINGS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
"""The tasks memplan trains a Hugging Face model for, and transformers' mapping of each."""


def _mapping(task: str) -> Mapping[str, Any]:
    import_transformers()
    from transformers.models.auto import modeling_auto  # local: the optional hf extra

    mapping: Mapping[str, Any] = getattr(modeling_auto, TASK_MAPPINGS[task])
    return mapping


def model_types(task: str) -> list[str]:
    """The model types of the installed transformers that have a head for ``task``."""
    return list(_mapping(task))


def _names(config_class: type, default: Any) -> set[str]:
    """Every name the class takes: its defaults' fields, constructor arguments, aliases."""
    names = set(default.to_dict())
    names.update(inspect.signature(config_class).parameters)
    names.update((getattr(config_class, "attribute_map", None) or {}).keys())
    if dataclasses.is_dataclass(default):
        names.update(f.name for f in dataclasses.fields(default))
    return names


def _kept_layers(lists: list[list[Any]], layers: int) -> list[int]:
    """The two layers a tiny model keeps: the first, and the first that differs from it in one of
    the per-layer lists (else the second): a hybrid model stays one.
    """
    other = min(
        (next((i for i in range(1, layers) if v[i] != v[0]), layers) for v in lists),
        default=layers,
    )
    return [0, other if other < layers else 1]


def _per_layer_config(overrides: dict[str, Any], kept: list[int]) -> dict[str, Any]:
    """A heterogeneous config's per-layer overrides (Gemma-4's wider global layers) for the kept
    layers, renumbered and shrunk like the rest.
    """
    found: dict[str, Any] = {}
    for key, entry in overrides.items():
        index = int(key)
        if index in kept and isinstance(entry, dict):
            tiny = {k: next((v for keys, v in SIZES.items() if k in keys), value)
                    for k, value in entry.items()}  # fmt: skip
            tiny.update(_same_heads(entry))
            found[str(kept.index(index)).zfill(len(key))] = tiny
    return found


def _same_heads(values: dict[str, Any]) -> dict[str, Any]:
    """As many key-value heads as query heads where the type has as many (no grouped-query
    attention where it has none).
    """
    heads = values.get("num_attention_heads")
    if isinstance(heads, int) and values.get("num_key_value_heads") == heads:
        return {"num_key_value_heads": HEADS}
    return {}


def _value(config: Any, key: str) -> Any:
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001 - a per-layer attribute a config refuses to read globally
        return None


def _per_stage(key: str, values: list[Any]) -> list[Any]:
    if PER_STAGE[key] is not None:
        return [PER_STAGE[key]] * len(values)
    if key == "num_heads":
        return [min(2**i, HEADS) for i in range(len(values))]
    return [min(32 * 2 ** (i // 2), WIDTH) for i in range(len(values))]  # group norms of 32


def _token_ids(config: dict[str, Any], vocab: int) -> dict[str, Any]:
    """Special token ids at or past the small vocabulary, moved to its last ids."""
    moved: dict[str, Any] = {}
    spare = iter(range(vocab - 1, vocab - SPECIAL_IDS - 1, -1))
    for key, value in config.items():
        if not key.endswith(("_token_id", "_token_index", "_token_ids")):
            continue
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and value >= vocab - SPECIAL_IDS:
            moved[key] = next(spare, vocab - 1)
        elif isinstance(value, list) and any(
            isinstance(v, int) and v >= vocab - SPECIAL_IDS for v in value
        ):
            moved[key] = [next(spare, vocab - 1) for _ in value]
    return moved


def _shrunk(config_class: type, default: Any) -> dict[str, Any]:
    """The constructor arguments of a tiny config of ``config_class`` (NOTE [ Shrinking a
    config ]).
    """
    names = _names(config_class, default)
    values = default.to_dict()
    kwargs: dict[str, Any] = {}
    staged = isinstance(values.get("depths"), list)  # a hierarchical vision model
    for keys, value in SIZES.items():
        if staged and keys in (SIZES_LAYER_KEYS, SIZES_WIDTH_KEYS):
            continue  # its stages' lists say its depth and widths
        for key in keys:
            if key in names:
                current = values[key] if key in values else _value(default, key)
                off = current == 0 or (current is None and "lora" in key)
                if isinstance(current, (list, tuple, dict)) or (key in values and off):
                    continue  # a list, or a part the type's defaults leave out (0, no LoRA)
                kwargs[key] = value
    layers = next((values[k] for k in SIZES_LAYER_KEYS if isinstance(values.get(k), int)), 0)
    per_layer = {
        k: v
        for k, v in values.items()
        if isinstance(v, list) and layers > 1 and len(v) == layers and k not in PER_STAGE
    }
    kept = _kept_layers(list(per_layer.values()), layers)
    for key, value in values.items():
        if key in PER_STAGE and isinstance(value, list) and value:
            kwargs[key] = _per_stage(key, value)
        elif key in per_layer and key not in kwargs:
            kwargs[key] = [value[i] for i in kept]
        elif key == "per_layer_config" and isinstance(value, dict):
            kwargs[key] = _per_layer_config(value, kept)
        elif isinstance(value, dict) and key.endswith("_config") and "model_type" in value:
            kwargs[key] = _shrunk_sub(value)
    if staged and "image_size" in kwargs:
        kwargs["image_size"] = 2 * IMAGE_SIZE  # four stages halving it: 16 x 16 patches to 2 x 2
    kwargs.update(_coupled(names, values, kwargs))
    if "num_key_value_heads" in kwargs:
        kwargs.update(_same_heads(values))
    if isinstance(kwargs.get("vocab_size"), int):
        kwargs.update(_token_ids(values, kwargs["vocab_size"]))
    if "num_labels" in names or "id2label" in names:
        kwargs["num_labels"] = LABELS
    return kwargs


def _coupled(names: set[str], values: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Sizes that must agree with others: a state-space block's heads times their width is its
    expanded width; a convolutional stem as wide as the first stage; multi-head latent
    attention's rotary part is its ``head_dim``.
    """
    found: dict[str, Any] = {}
    expand = values.get("mamba_expand", values.get("expand", 2))
    if isinstance(expand, int) and any("state" in k for k in kwargs):
        heads = expand * WIDTH // HEAD_DIM
        for key in ("mamba_n_heads", "n_mamba_heads", "mamba_num_heads"):
            if key in names:
                found[key] = heads
        if isinstance(values.get("num_heads"), int) and "expand" in values:  # Mamba-2
            found["num_heads"] = heads
    if isinstance(kwargs.get("hidden_sizes"), list) and "embedding_size" in names:
        found["embedding_size"] = kwargs["hidden_sizes"][0] // 4  # a ResNet's stem, narrow:
        # at full resolution, it would outweigh the blocks
    if "qk_rope_head_dim" in kwargs:
        for key, value in (("head_dim", HEAD_DIM // 2), ("qk_head_dim", HEAD_DIM)):
            if key in names:
                found[key] = value
    return found


SIZES_LAYER_KEYS = next(keys for keys in SIZES if "num_hidden_layers" in keys)
SIZES_WIDTH_KEYS = next(keys for keys in SIZES if "hidden_size" in keys)


def _shrunk_sub(values: dict[str, Any]) -> dict[str, Any]:
    """A sub-config (``text_config``...) as a dict of its values, shrunk."""
    transformers = import_transformers()
    if values["model_type"] not in transformers.CONFIG_MAPPING:
        return values
    config_class = transformers.CONFIG_MAPPING[values["model_type"]]
    default = config_class(**{k: v for k, v in values.items() if k != "model_type"})
    return {**values, **_shrunk(config_class, default)}


def tiny_config(model_type: str) -> Any:
    """The config of a tiny model of ``model_type`` (NOTE [ Shrinking a config ]).

    Raises
    ------
    Exception
        Whatever the config class raises for these sizes (the type needs other values).
    """
    transformers = import_transformers()
    config_class = transformers.CONFIG_MAPPING[model_type]
    with quiet_transformers(transformers):
        default = config_class()
        kwargs = _shrunk(config_class, default)
        try:
            config = config_class(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a class that checks its sizes: keep one default
            config = _without_one_group(config_class, kwargs, exc)
    config.use_cache = False
    return config


def _without_one_group(config_class: type, kwargs: dict[str, Any], error: Exception) -> Any:
    """The config with the class's own default for the first group of :data:`SIZES` whose tiny
    value it refuses (``num_experts_per_tok=1`` only...); ``error`` when none does.
    """
    for keys in SIZES:
        if not any(key in kwargs for key in keys) or keys == SIZES_LAYER_KEYS:
            continue
        try:
            return config_class(**{k: v for k, v in kwargs.items() if k not in keys})
        except Exception:  # noqa: BLE001, S112 - try the next group
            continue
    raise error


def tiny_model(model_type: str, task: str, seed: int = 0) -> nn.Module:
    """A tiny model of ``model_type`` with the head for ``task`` (a key of
    :data:`TASK_MAPPINGS`), random weights drawn from ``seed`` (the global RNG is left as it
    was), in training mode.

    Raises
    ------
    Exception
        Whatever transformers raises building it (NOTE [ Shrinking a config ]).
    """
    transformers = import_transformers()
    config = tiny_config(model_type)
    names = _mapping(task)[model_type]  # a tuple where a type has several heads (DeiT's)
    model_class = getattr(transformers, names[0] if isinstance(names, tuple) else names)
    expected = getattr(model_class, "config_class", None)
    if isinstance(expected, type) and not isinstance(config, expected):
        config = config.get_text_config()  # a multimodal type whose head takes its text config
    with quiet_transformers(transformers), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class._from_config(config)
    without_kv_cache(model)
    return model.train()


def tiny_batch(
    model: nn.Module, task: str, batch: int = 2, seq: int = 32, seed: int = 0
) -> dict[str, Tensor]:
    """A batch for a tiny model: ``input_ids`` (ids below the special tokens), an all-ones
    ``attention_mask`` and ``labels`` (the ids for a causal LM, 15% of them for a masked LM, the
    rest -100), or ``pixel_values`` and class ``labels`` for an image classifier.
    """
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    if task == "image-classification":
        channels = getattr(config, "num_channels", 3)
        size = getattr(config, "image_size", IMAGE_SIZE)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        images = torch.randn((batch, channels, *size), generator=generator)
        labels = torch.randint(0, config.num_labels, (batch,), generator=generator)
        return {"pixel_values": images, "labels": labels}
    vocab = int(getattr(config, "vocab_size", None) or model.get_input_embeddings().num_embeddings)
    ids = torch.randint(0, max(2, vocab - SPECIAL_IDS), (batch, seq), generator=generator)
    if task == "masked-lm":
        picked = torch.rand(ids.shape, generator=generator) < MASKED_FRACTION
        picked[:, 0] = True
        labels = torch.where(picked, ids, IGNORE_INDEX)
    else:
        labels = ids.clone()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
