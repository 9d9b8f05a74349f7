"""The Qwen family: Qwen2ForCausalLM (bias on q/k/v) and Qwen3ForCausalLM (RMSNorm on q and k per head).

Both are Llama blocks with one switch each; only the config parsing differs.
"""

from __future__ import annotations

from typing import Any

from specrt.core.errors import CheckpointError
from specrt.models.config import DecoderConfig, flag
from specrt.models.llama import LlamaDecoder, parse_config as parse_llama


def parse_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    if flag(raw, "use_sliding_window", False):
        raise CheckpointError("Qwen use_sliding_window=true is not supported (only full attention)")
    if architecture == "Qwen2ForCausalLM":
        # Qwen2 always has q/k/v bias and no o_proj bias.
        return parse_llama(raw, architecture, family="qwen", attention_bias=True, o_bias=False,
                           sliding_window=None)
    bias = flag(raw, "attention_bias", False)
    return parse_llama(raw, architecture, family="qwen", attention_bias=bias, o_bias=bias, qk_norm=True,
                       sliding_window=None)


QwenDecoder = LlamaDecoder
