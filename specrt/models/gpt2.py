"""GPT2LMHeadModel: learned absolute positions, LayerNorm, fused qkv (Conv1D: weight is [in, out])."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specrt.core.errors import CheckpointError
from specrt.models.base import Decoder, DecoderOutput
from specrt.models.config import DecoderConfig, flag
from specrt.models.layers import ACTIVATIONS, attend


def parse_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    act = raw.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"unsupported activation_function {act!r}")
    hidden = raw["n_embd"]
    heads = raw["n_head"]
    return DecoderConfig(
        architecture=architecture,
        family="gpt2",
        vocab_size=raw["vocab_size"],
        hidden_size=hidden,
        num_layers=raw["n_layer"],
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=raw.get("n_inner") or 4 * hidden,
        norm_eps=raw.get("layer_norm_epsilon", 1e-5),
        max_position_embeddings=raw.get("n_positions", 1024),
        tie_word_embeddings=flag(raw, "tie_word_embeddings", True),
        hidden_act=act,
        scale_attn_weights=flag(raw, "scale_attn_weights", True),
        scale_attn_by_inverse_layer_idx=flag(raw, "scale_attn_by_inverse_layer_idx", False),
    )


def attention_scale(c: DecoderConfig, layer: int) -> float:
    """The factor on layer `layer`'s attention scores, as transformers' GPT2Attention computes it."""
    scale = c.head_dim**-0.5 if c.scale_attn_weights else 1.0
    return scale / (layer + 1) if c.scale_attn_by_inverse_layer_idx else scale


class Conv1D(nn.Module):
    """GPT-2's linear layer with the weight stored as [in, out]."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.matmul(x, self.weight) + self.bias


class _Attn(nn.Module):
    def __init__(self, c: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.c_attn = Conv1D(c.hidden_size, 3 * c.hidden_size)
        self.c_proj = Conv1D(c.hidden_size, c.hidden_size)
        self.c = c
        self.scale = attention_scale(c, layer)

    def forward(self, x, k_past, v_past, past_lengths=None, tree_mask=None):
        b, s, _ = x.shape
        c = self.c
        q, k, v = self.c_attn(x).split(c.hidden_size, dim=-1)
        shape = (b, s, c.num_heads, c.head_dim)
        q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
        out = attend(q, k_past, v_past, k, v, self.scale, past_lengths=past_lengths, tree_mask=tree_mask)
        return self.c_proj(out), k, v


class _MLP(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.c_fc = Conv1D(c.hidden_size, c.intermediate_size)
        self.c_proj = Conv1D(c.intermediate_size, c.hidden_size)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class _Block(nn.Module):
    def __init__(self, c: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.attn = _Attn(c, layer)
        self.ln_2 = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.mlp = _MLP(c)

    def forward(self, x, k_past, v_past, past_lengths=None, tree_mask=None):
        a, k, v = self.attn(self.ln_1(x), k_past, v_past, past_lengths, tree_mask)
        x = x + a
        return x + self.mlp(self.ln_2(x)), k, v


class _Transformer(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.hidden_size)
        self.wpe = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.h = nn.ModuleList(_Block(c, i) for i in range(c.num_layers))
        self.ln_f = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)


class GPT2Decoder(Decoder):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = _Transformer(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def input_embedding(self) -> nn.Embedding:
        return self.transformer.wte

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        # Original GPT-2 checkpoints store the body without the "transformer." prefix.
        renamed = {}
        for name, value in tensors.items():
            if name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
                continue  # causal-mask buffers of old checkpoints
            if not name.startswith(("transformer.", "lm_head.")):
                name = "transformer." + name
            renamed[name] = value
        super().load_hf_state_dict(renamed)

    def forward(self, input_ids, position_ids, past_keys, past_values, past_lengths=None,
                tree_mask=None) -> DecoderOutput:
        # past_lengths: [B] valid past rows per sequence (layers.attend) or None
        t = self.transformer
        x = t.wte(input_ids) + t.wpe(position_ids)
        new_keys, new_values = [], []
        for block, k_past, v_past in zip(t.h, past_keys, past_values):
            x, k, v = block(x, k_past, v_past, past_lengths, tree_mask)
            new_keys.append(k)
            new_values.append(v)
        hidden = t.ln_f(x)
        return DecoderOutput(self.lm_head(hidden).float(), hidden, tuple(new_keys), tuple(new_values))
