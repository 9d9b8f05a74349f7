"""Gemma 2 (Gemma2ForCausalLM, model_type `gemma2`): the Gemma 3 module without the q / k norms.

What Gemma 2 shares with Gemma 3 (gemma3.py builds both): four `(1 + weight)` norms per block, embeddings scaled by
sqrt(hidden), a GeGLU MLP, attention scale `query_pre_attn_scalar ** -0.5`, sliding-window layers interleaved with
global ones (every other layer from the first, `layer_types` when given), soft-capped final logits. What differs:
no RMSNorm on q and k, attention scores soft-capped (`attn_logit_softcapping`, 50 in the released models; transformers'
Gemma 2 applies it, its Gemma 3 does not), and one rope for every layer. Defaults are transformers' Gemma2Config's,
for keys a config.json leaves out.
"""

from __future__ import annotations

from typing import Any

from specrt.core.errors import CheckpointError
from specrt.models.config import DecoderConfig, RopeConfig
from specrt.models.layers import ACTIVATIONS


def _layer_types(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    """`layer_types`, or transformers' default: layers 0, 2, 4, ... sliding, 1, 3, 5, ... global."""
    if raw.get("layer_types"):
        return tuple(raw["layer_types"])
    return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers))


def parse_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    if raw.get("use_bidirectional_attention"):
        raise CheckpointError("Gemma 2 use_bidirectional_attention=true (an encoder) is not supported")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise CheckpointError(f"unsupported hidden_activation {act!r}; supported: {', '.join(ACTIVATIONS)}")
    layers = raw["num_hidden_layers"]
    heads = raw["num_attention_heads"]
    bias = bool(raw.get("attention_bias", False))
    rope = dict(raw)
    if raw.get("rope_parameters") is None and raw.get("rope_theta") is None:
        rope["rope_theta"] = 10000.0
    return DecoderConfig(
        architecture=architecture,
        family="gemma3",  # gemma3.py's module and the fused graph's Gemma layers, with qk_norm off
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or 256,
        intermediate_size=raw["intermediate_size"],
        norm_eps=raw.get("rms_norm_eps", 1e-6),
        max_position_embeddings=raw.get("max_position_embeddings", 8192),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        hidden_act=act,
        attention_bias=bias,
        o_bias=bias,
        qk_norm=False,
        sliding_window=raw.get("sliding_window", 4096),
        rope=RopeConfig.from_hf(rope),
        layer_types=_layer_types(raw, layers),
        local_rope=None,
        query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)),
        attn_logit_softcapping=raw.get("attn_logit_softcapping", 50.0),
        final_logit_softcapping=raw.get("final_logit_softcapping", 30.0),
    )
