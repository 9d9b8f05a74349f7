"""Phi-3 (Phi3ForCausalLM: Phi-3 / Phi-3.5 mini and medium): Llama blocks whose checkpoints store q, k, v as one
`qkv_proj` and gate, up as one `gate_up_proj` (gate first), split here into the Llama module's weights as they load.

The rope is the default one or `longrope` (Phi-3 128k, Phi-3.5: per-dimension short factors and an attention factor
on cos and sin; transformers' older names for it, `su` and Phi-3's `yarn`, read as longrope, as transformers reads
them); compile keeps --max-seq-len within `original_max_position_embeddings` for longrope and within
`sliding_window` (2047 in Phi-3 mini 4k), where transformers' outputs are those of the plain graph.
`partial_rotary_factor` < 1 (Phi-4 mini: 0.75) turns only each head's first dimensions, as transformers' Phi-3 does
(the fused graph gives GroupQueryAttention cos / sin caches of that width).
"""

from __future__ import annotations

from typing import Any

import torch

from specrt.core.errors import CheckpointError
from specrt.models.config import DecoderConfig
from specrt.models.llama import LlamaDecoder, parse_config as parse_llama

OLD_LONGROPE_NAMES = ("su", "yarn")  # Phi3Config maps both to longrope


def parse_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    raw = dict(raw)
    for key in ("rope_scaling", "rope_parameters"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) in OLD_LONGROPE_NAMES:
            raw[key] = {**params, "rope_type": "longrope"}
    return parse_llama(raw, architecture, partial_rotary=True)


def split_fused(tensors: dict[str, torch.Tensor], c: DecoderConfig) -> dict[str, torch.Tensor]:
    """qkv_proj -> q_proj, k_proj, v_proj and gate_up_proj -> gate_proj, up_proj (other tensors as they are)."""
    q_rows, kv_rows, inner = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    out = {}
    for name, t in tensors.items():
        if name.endswith(".self_attn.qkv_proj.weight"):
            _check(name, t, (q_rows + 2 * kv_rows, c.hidden_size))
            base = name[: -len("qkv_proj.weight")]
            q, k, v = torch.split(t, [q_rows, kv_rows, kv_rows])
            out.update({f"{base}q_proj.weight": q, f"{base}k_proj.weight": k, f"{base}v_proj.weight": v})
        elif name.endswith(".mlp.gate_up_proj.weight"):
            _check(name, t, (2 * inner, c.hidden_size))
            base = name[: -len("gate_up_proj.weight")]
            gate, up = torch.split(t, [inner, inner])
            out.update({f"{base}gate_proj.weight": gate, f"{base}up_proj.weight": up})
        else:
            out[name] = t
    return out


def _check(name: str, t: torch.Tensor, shape: tuple[int, int]) -> None:
    if tuple(t.shape) != shape:
        raise CheckpointError(f"weight {name} has shape {tuple(t.shape)}, config.json implies {shape}")


class Phi3Decoder(LlamaDecoder):
    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        super().load_hf_state_dict(split_fused(tensors, self.config))
