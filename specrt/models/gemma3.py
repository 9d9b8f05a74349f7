"""Gemma 3 text (Gemma3ForCausalLM, model_type `gemma3_text`); Gemma 2 (gemma2.py) is this module without q / k norms.

Differences from Llama, each a few lines here: sliding-window layers interleaved with global layers
(`layer_types`), a rope per layer type, RMSNorm on q and k, four norms per block (pre/post attention,
pre/post feed-forward) that scale by `(1 + weight)`, embeddings multiplied by sqrt(hidden) in the embedding
dtype, a GeGLU MLP (`gelu_pytorch_tanh`), attention scale `query_pre_attn_scalar ** -0.5`, optional
soft-capping of the final logits, tied embeddings by default. `attn_logit_softcapping` is read but not
applied, exactly as transformers' Gemma 3 does (`attend` supports it for a model that applies it).

The sliding window is an attention mask over the kept cache rows (`layers.attend(window=...)`): every
position stays in the prefix-bound buffer, so rollback and the cache layout are the same as for Llama.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specrt.core.errors import CheckpointError
from specrt.models.base import Decoder, DecoderOutput
from specrt.models.config import DecoderConfig, RopeConfig, flag
from specrt.models.layers import ACTIVATIONS, Rotary, apply_rotary, attend
from specrt.models.llama import MLP

# transformers' Gemma3TextConfig defaults, for keys a config.json leaves out
DEFAULT_GLOBAL_THETA = 1_000_000.0
DEFAULT_LOCAL_THETA = 10_000.0
DEFAULT_SLIDING_PATTERN = 6


def _layer_types(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    """`layer_types`, or (older configs) every `sliding_window_pattern`-th layer global, the rest sliding."""
    if raw.get("layer_types"):
        return tuple(raw["layer_types"])
    pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or DEFAULT_SLIDING_PATTERN)
    return tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers))


def _ropes(raw: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """(global rope, local rope) from `rope_parameters` per layer type, or `rope_theta` + `rope_local_base_freq`
    (+ `rope_scaling` on the global layers)."""
    params = raw.get("rope_parameters")
    if params is not None:
        if not {"full_attention", "sliding_attention"} & set(params):
            raise CheckpointError(
                "config.json: Gemma 3 rope_parameters must be keyed by layer type (full_attention, sliding_attention)"
            )
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        full = dict(raw.get("rope_scaling") or {})
        local = {}
        if raw.get("rope_theta") is not None:
            full["rope_theta"] = raw["rope_theta"]
        if raw.get("rope_local_base_freq") is not None:
            local["rope_theta"] = raw["rope_local_base_freq"]
    full.setdefault("rope_theta", DEFAULT_GLOBAL_THETA)
    local.setdefault("rope_theta", DEFAULT_LOCAL_THETA)
    length = {"max_position_embeddings": raw.get("max_position_embeddings", 131_072)}
    return (RopeConfig.from_hf({"rope_parameters": full, **length}),
            RopeConfig.from_hf({"rope_parameters": local, **length}))


def gemma_fields(raw: dict[str, Any], architecture: str, name: str, max_positions: int) -> dict[str, Any]:
    """The DecoderConfig fields Gemma 2 and Gemma 3 read alike (`name` for messages; `max_positions`: the default
    max_position_embeddings)."""
    if raw.get("use_bidirectional_attention"):
        raise CheckpointError(f"{name} use_bidirectional_attention=true (an encoder) is not supported")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise CheckpointError(f"unsupported hidden_activation {act!r}; supported: {', '.join(ACTIVATIONS)}")
    heads = raw["num_attention_heads"]
    bias = flag(raw, "attention_bias", False)
    return dict(architecture=architecture, family="gemma3", vocab_size=raw["vocab_size"],
                hidden_size=raw["hidden_size"], num_layers=raw["num_hidden_layers"], num_heads=heads,
                num_kv_heads=raw.get("num_key_value_heads") or heads, head_dim=raw.get("head_dim") or 256,
                intermediate_size=raw["intermediate_size"], norm_eps=raw.get("rms_norm_eps", 1e-6),
                max_position_embeddings=raw.get("max_position_embeddings", max_positions),
                tie_word_embeddings=flag(raw, "tie_word_embeddings", True), hidden_act=act,
                attention_bias=bias, o_bias=bias, sliding_window=raw.get("sliding_window", 4096),
                query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)))


def parse_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    fields = gemma_fields(raw, architecture, "Gemma 3", 131_072)
    full_rope, local_rope = _ropes(raw)
    return DecoderConfig(
        **fields,
        qk_norm=True,
        rope=full_rope,
        layer_types=_layer_types(raw, fields["num_layers"]),
        local_rope=local_rope,
        # transformers' Gemma3Attention (5.x) never passes attn_logit_softcapping to its attention function
        # (Gemma 3 replaced it by q/k norms; released configs have null): follow the reference and ignore it.
        attn_logit_softcapping=None,
        final_logit_softcapping=raw.get("final_logit_softcapping"),
    )


class GemmaRMSNorm(nn.Module):
    """RMSNorm that scales by (1 + weight), computed in fp32 (weights are stored zero-centred)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:  # Gemma 3 (Gemma 2 has none: gemma2.py)
            self.q_norm = GemmaRMSNorm(c.head_dim, c.norm_eps)
            self.k_norm = GemmaRMSNorm(c.head_dim, c.norm_eps)
        self.c = c
        self.window = c.layer_window(layer)
        self.scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5

    def forward(self, x, cos, sin, k_past, v_past, past_lengths=None, tree_mask=None):
        # x: [B, S, hidden]; cos, sin: [B, S, 1, D]; k_past, v_past: [B, P, Hkv, D]; past_lengths: [B] or None
        b, s, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, s, c.num_heads, c.head_dim)
        k = self.k_proj(x).view(b, s, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).view(b, s, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = attend(q, k_past, v_past, k, v, self.scale, window=self.window, softcap=c.attn_logit_softcapping,
                     past_lengths=past_lengths, tree_mask=tree_mask)
        return self.o_proj(out), k, v


class Block(nn.Module):
    def __init__(self, c: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(c, layer)
        self.mlp = MLP(c)
        self.input_layernorm = GemmaRMSNorm(c.hidden_size, c.norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(c.hidden_size, c.norm_eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(c.hidden_size, c.norm_eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(c.hidden_size, c.norm_eps)

    def forward(self, x, cos, sin, k_past, v_past, past_lengths=None, tree_mask=None):
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, k_past, v_past, past_lengths, tree_mask)
        x = x + self.post_attention_layernorm(attn)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x, k, v


class _Body(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.num_layers))
        self.norm = GemmaRMSNorm(c.hidden_size, c.norm_eps)


class Gemma3Decoder(Decoder):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary_global = Rotary(config.rope, config.head_dim)
        self.rotary_local = Rotary(config.local_rope or config.rope, config.head_dim)
        self.tie_weights()

    def input_embedding(self) -> nn.Embedding:
        return self.model.embed_tokens

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [B, S] -> [B, S, hidden]
        x = self.model.embed_tokens(input_ids)
        # transformers rounds sqrt(hidden) to the embedding dtype first (bf16: 25.25 for hidden 640, not 25.30)
        return x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)

    def forward(self, input_ids, position_ids, past_keys, past_values, past_lengths=None,
                tree_mask=None) -> DecoderOutput:
        # input_ids, position_ids: [B, S]; past_*: L x [B, P, Hkv, D]; past_lengths: [B] (layers.attend) or None
        x = self.embed(input_ids)
        global_rope = self.rotary_global.cos_sin(position_ids)  # (cos, sin): [B, S, 1, D] each
        local_rope = self.rotary_local.cos_sin(position_ids) if self.config.windowed else global_rope
        new_keys, new_values = [], []
        for layer, k_past, v_past in zip(self.model.layers, past_keys, past_values):
            cos, sin = local_rope if layer.self_attn.window is not None else global_rope
            x, k, v = layer(x, cos, sin, k_past, v_past, past_lengths, tree_mask)
            new_keys.append(k)
            new_values.append(v)
        hidden = self.model.norm(x)
        logits = self.lm_head(hidden).float()  # [B, S, V]: the only vocabulary-sized tensor
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return DecoderOutput(logits, hidden, tuple(new_keys), tuple(new_values))
