"""IBM Granite 3 (GraniteForCausalLM): Llama blocks with four scalars (DecoderConfig): embeddings x
`embedding_multiplier`, each attention and MLP output x `residual_multiplier` before its residual add, the attention
scale `attention_multiplier` (instead of head_dim ** -0.5), logits / `logits_scaling`. Defaults for keys a config
leaves out are transformers' GraniteConfig's (all 1.0, so an omitted attention_multiplier is a scale of 1).
"""

from __future__ import annotations

from typing import Any

from specrt.models.config import DecoderConfig
from specrt.models.llama import parse_config as parse_llama


def parse_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    scalars = {name: float(raw.get(name, 1.0)) for name in ("embedding_multiplier", "residual_multiplier",
                                                             "attention_multiplier", "logits_scaling")}
    return parse_llama(raw, architecture, **scalars)
