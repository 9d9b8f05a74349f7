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

from specrt.models.config import DecoderConfig, RopeConfig
from specrt.models.gemma3 import gemma_fields


def _layer_types(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    """`layer_types`, or transformers' default: layers 0, 2, 4, ... sliding, 1, 3, 5, ... global."""
    if raw.get("layer_types"):
        return tuple(raw["layer_types"])
    return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers))


def parse_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    fields = gemma_fields(raw, architecture, "Gemma 2", 8192)  # shared with Gemma 3; family "gemma3": its module
    rope = dict(raw)
    if raw.get("rope_parameters") is None and raw.get("rope_theta") is None:
        rope["rope_theta"] = 10000.0
    return DecoderConfig(
        **fields,
        qk_norm=False,
        rope=RopeConfig.from_hf(rope),
        layer_types=_layer_types(raw, fields["num_layers"]),
        local_rope=None,
        attn_logit_softcapping=raw.get("attn_logit_softcapping", 50.0),
        final_logit_softcapping=raw.get("final_logit_softcapping", 30.0),
    )
