"""The Llama family: LlamaForCausalLM and MistralForCausalLM (RMSNorm, RoPE, GQA, SwiGLU).

Qwen2/Qwen3 reuse these blocks with qkv bias / q-k norm switched on (see qwen.py). Parameter names
mirror the Hugging Face checkpoints so safetensors load without renaming.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specrt.core.errors import CheckpointError
from specrt.models.base import Decoder, DecoderOutput
from specrt.models.config import DecoderConfig, RopeConfig, flag
from specrt.models.layers import ACTIVATIONS, RMSNorm, Rotary, apply_rotary, attend


def parse_config(raw: dict[str, Any], architecture: str, partial_rotary: bool = False,
                 **overrides: Any) -> DecoderConfig:
    """DecoderConfig from a Llama-style config.json (also used by Mistral, Qwen and Phi-3). `partial_rotary`: the
    architecture turns only part of each head (transformers' Phi-3 does; its Llama, Mistral and Qwen do not)."""
    heads = raw["num_attention_heads"]
    hidden = raw["hidden_size"]
    partial = raw.get("partial_rotary_factor", (raw.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0))
    if partial != 1.0 and not partial_rotary:  # top level, or inside rope_parameters as transformers 5 writes it
        raise CheckpointError(f"partial_rotary_factor {partial} (rotary on part of each head) is not supported for "
                              f"{architecture}")
    act = raw.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"unsupported hidden_act {act!r}; supported: {', '.join(ACTIVATIONS)}")
    fields = dict(
        architecture=architecture,
        family="llama",
        vocab_size=raw["vocab_size"],
        hidden_size=hidden,
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        intermediate_size=raw["intermediate_size"],
        norm_eps=raw.get("rms_norm_eps", 1e-6),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        tie_word_embeddings=flag(raw, "tie_word_embeddings", False),
        hidden_act=act,
        attention_bias=flag(raw, "attention_bias", False),
        o_bias=flag(raw, "attention_bias", False),
        mlp_bias=flag(raw, "mlp_bias", False),
        sliding_window=raw.get("sliding_window"),
        rope=RopeConfig.from_hf(raw),
        partial_rotary_factor=partial,
    )
    fields.update(overrides)
    return DecoderConfig(**fields)


class Attention(nn.Module):
    def __init__(self, c: DecoderConfig, rope: bool = True) -> None:  # rope False: a NoPE layer (SmolLM3)
        super().__init__()
        self.rope = rope
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.norm_eps)
        self.c = c

    def forward(self, x, cos, sin, k_past, v_past, past_lengths=None, tree_mask=None):
        # x: [B, S, hidden]; k_past, v_past: [B, P, Hkv, D]; past_lengths: [B] or None
        b, s, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, s, c.num_heads, c.head_dim)
        k = self.k_proj(x).view(b, s, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).view(b, s, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        scale = c.head_dim**-0.5 if c.attention_multiplier is None else c.attention_multiplier  # Granite: its own
        out = attend(q, k_past, v_past, k, v, scale, past_lengths=past_lengths, tree_mask=tree_mask)
        return self.o_proj(out), k, v


class MLP(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: DecoderConfig, layer: int = 0) -> None:
        super().__init__()
        self.self_attn = Attention(c, rope=layer not in c.nope_layers)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.norm_eps)

    def forward(self, x, cos, sin, k_past, v_past, past_lengths=None, tree_mask=None):
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, k_past, v_past, past_lengths, tree_mask)
        r = self.self_attn.c.residual_multiplier  # Granite; 1 elsewhere
        x = x + (attn if r == 1 else attn * r)
        out = self.mlp(self.post_attention_layernorm(x))
        x = x + (out if r == 1 else out * r)
        return x, k, v


class _Body(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.norm_eps)


class LlamaDecoder(Decoder):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = Rotary(config.rope, config.rotary_dim)
        self.tie_weights()

    def input_embedding(self) -> nn.Embedding:
        return self.model.embed_tokens

    def forward(self, input_ids, position_ids, past_keys, past_values, past_lengths=None,
                tree_mask=None) -> DecoderOutput:
        # input_ids, position_ids: [B, S]; past_*: L x [B, P, Hkv, D]; past_lengths: [B] (layers.attend) or None
        x = self.model.embed_tokens(input_ids)
        if self.config.embedding_multiplier != 1:  # Granite
            x = x * self.config.embedding_multiplier
        cos, sin = self.rotary.cos_sin(position_ids)
        new_keys, new_values = [], []
        for layer, k_past, v_past in zip(self.model.layers, past_keys, past_values):
            x, k, v = layer(x, cos, sin, k_past, v_past, past_lengths, tree_mask)
            new_keys.append(k)
            new_values.append(v)
        hidden = self.model.norm(x)
        logits = self.lm_head(hidden).float()
        if self.config.logits_scaling != 1:  # Granite
            logits = logits / self.config.logits_scaling
        return DecoderOutput(logits, hidden, tuple(new_keys), tuple(new_values))
