"""SmolLM3 (SmolLM3ForCausalLM): Llama blocks where some layers attend without any rope ("NoPE": every 4th layer in
SmolLM3-3B). `no_rope_layers` holds one flag per layer, 1 = the layer uses the rope (transformers' naming), or when
absent every `no_rope_layer_interval`-th layer (4) has none; the Llama module and fused layers skip the rotation
there (`DecoderConfig.nope_layers`). `use_sliding_window: true` is refused (full attention only), as for Qwen2.
"""

from __future__ import annotations

from typing import Any

from specrt.core.errors import CheckpointError
from specrt.models.config import DecoderConfig
from specrt.models.llama import parse_config as parse_llama

DEFAULT_NOPE_INTERVAL = 4  # transformers' SmolLM3Config default


def parse_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    if raw.get("use_sliding_window", False):
        raise CheckpointError("SmolLM3 use_sliding_window=true is not supported (only full attention)")
    layers = raw["num_hidden_layers"]
    flags = raw.get("no_rope_layers")
    if flags is None:
        interval = raw.get("no_rope_layer_interval") or DEFAULT_NOPE_INTERVAL
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(flags, list) or len(flags) != layers or any(f not in (0, 1) for f in flags):
        raise CheckpointError(f"config.json: no_rope_layers must hold one 0 / 1 flag for each of the {layers} layers")
    nope = tuple(i for i, uses_rope in enumerate(flags) if not uses_rope)
    return parse_llama(raw, architecture, nope_layers=nope, sliding_window=None)
