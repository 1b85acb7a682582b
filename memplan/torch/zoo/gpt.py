"""GPT: a decoder-only transformer stack (GPT-2 layout, pre-norm, untied output head).

memplan's own model (not a torchvision copy): the transformer of the built-in ``gpt-small`` and
``gpt-tiny``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memplan.errors import InputError
from memplan.torch.zoo.layers import uninitialized

# --------------------------------------------------------------------------------------------
# GPT: a decoder-only transformer stack (GPT-2 layout, pre-norm, untied output head)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`GPT` model.

    Attributes
    ----------
    vocab_size : int
        Number of tokens.
    seq_len : int
        Maximum sequence length (rows of the learned position embedding); also the default one.
    n_layer, n_head, d_model : int
        Blocks, attention heads, width.
    batch_size : int
        Default batch size of :meth:`GPT.memplan_example_input`.
    """

    vocab_size: int = 50257
    seq_len: int = 1024
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    batch_size: int = 8


class GPTEmbedding(nn.Module):
    """Token embedding plus learned position embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = uninitialized(nn.Embedding, config.vocab_size, config.d_model)
        self.wpe = uninitialized(nn.Embedding, config.seq_len, config.d_model)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[-1], device=idx.device)
        return self.wte(idx) + self.wpe(positions)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (``F.scaled_dot_product_attention``)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.d_model % config.n_head:
            raise InputError(
                f"gpt: d_model {config.d_model} is not a multiple of n_head {config.n_head}"
            )
        self.n_head = config.n_head
        self.qkv = uninitialized(nn.Linear, config.d_model, 3 * config.d_model)
        self.proj = uninitialized(nn.Linear, config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    """Feed-forward layer: d -> 4d, GELU, 4d -> d."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = uninitialized(nn.Linear, config.d_model, 4 * config.d_model)
        self.act = nn.GELU()
        self.proj = uninitialized(nn.Linear, 4 * config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-2-like language model: embedding, ``n_layer`` blocks, final LayerNorm, linear head.

    The input is a ``(batch, seq)`` tensor of token ids; the output the ``(batch, seq, vocab)``
    logits. The output head is not tied to the token embedding, so that each stage of the chain
    owns its weights.

    Parameters
    ----------
    config : GPTConfig
        Sizes of the model.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = GPTEmbedding(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = uninitialized(nn.Linear, config.d_model, config.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for block in self.blocks:  # GPT-2's scaled init of the residual projections
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, idx: Tensor) -> Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def memplan_stages(self) -> list[tuple[str, nn.Module]]:
        """The chain memplan profiles: embedding, one stage per block, final norm + head."""
        stages: list[tuple[str, nn.Module]] = [("embedding", self.embed)]
        stages += [(f"block{i}", block) for i, block in enumerate(self.blocks)]
        stages.append(("head", nn.Sequential(self.ln_f, self.lm_head)))
        return stages

    def memplan_example_input(
        self, batch_size: int | None = None, input_shape: tuple[int, ...] | None = None
    ) -> Tensor:
        """Random token ids of shape ``(batch, seq)``; ``input_shape`` is ``(seq,)``."""
        batch = self.config.batch_size if batch_size is None else batch_size
        if input_shape is None:
            seq = self.config.seq_len
        elif len(input_shape) == 1:
            seq = input_shape[0]
        else:
            raise InputError(
                f"input shape {','.join(map(str, input_shape))}: a transformer takes (seq,), "
                f"e.g. {self.config.seq_len}"
            )
        if not 1 <= seq <= self.config.seq_len:
            raise InputError(
                f"input shape {seq}: sequence length must be 1..{self.config.seq_len} "
                "(the size of the position embedding)"
            )
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, self.config.vocab_size, (batch, seq), generator=generator)
