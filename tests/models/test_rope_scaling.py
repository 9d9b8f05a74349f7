"""Every rope type compile accepts gives transformers' cos and sin (its rotary embedding on the same config.json):
`default`, `linear`, `llama3`, `yarn`, `dynamic` (within max_position_embeddings), in the hub's older
`rope_scaling` form and the newer `rope_parameters` form; the others are refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from specrt.core.errors import CheckpointError
from specrt.models import parse_config
from specrt.models.layers import Rotary

BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
        "max_position_embeddings": 256, "rope_theta": 10000.0}

CASES = {
    "default_no_theta": {"rope_theta": None},
    "linear": {"rope_scaling": {"type": "linear", "factor": 4.0}},
    "llama3": {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    # transformers takes the pretraining length from max_position_embeddings when the config omits it (not 8192)
    "llama3_no_original": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0}, "max_position_embeddings": 64},
    "yarn_qwen_style": {"rope_theta": 1000000.0, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                  "original_max_position_embeddings": 32}},
    "yarn_betas": {"rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2,
                                    "original_max_position_embeddings": 32}},
    "yarn_attention_factor_untruncated": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.3,
                                                           "truncate": False, "original_max_position_embeddings": 64}},
    "yarn_mscale": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 0.9, "mscale_all_dim": 0.5,
                                     "original_max_position_embeddings": 64}},
    "yarn_parameters_form": {"rope_theta": None, "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0,
                                                                     "factor": 2.0,
                                                                     "original_max_position_embeddings": 64}},
    "dynamic": {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
    # a top-level original_max_position_embeddings (Phi-3's layout) wins over the one inside rope_scaling
    "yarn_top_level_original": {"original_max_position_embeddings": 32,
                                "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cos_sin_match_transformers(tmp_path, name):
    import transformers as tf
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    raw = {k: v for k, v in {**BASE, **CASES[name]}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    hf = LlamaRotaryEmbedding(tf.AutoConfig.from_pretrained(tmp_path))
    positions = torch.arange(200)[None]  # within max_position_embeddings (dynamic rescales only beyond it)
    ref_cos, ref_sin = hf(torch.zeros(1, 200, 16), positions)
    c = parse_config(raw)
    cos, sin = Rotary(c.rope, c.head_dim).cos_sin(positions)
    assert torch.allclose(cos[:, :, 0], ref_cos, atol=2e-5) and torch.allclose(sin[:, :, 0], ref_sin, atol=2e-5), name
    if "yarn" in name:
        assert c.rope.attention_factor != 1.0 and not torch.allclose(cos[:, :, 0].abs().max(), torch.tensor(1.0))


@pytest.mark.parametrize("rope_type", ["mrope", "su", "proportional"])  # longrope: Phi-3 (test_phi3.py)
def test_other_rope_types_are_refused_by_name(rope_type):
    raw = {**BASE, "rope_scaling": {"type": rope_type, "factor": 2.0, "short_factor": [1.0] * 8,
                                    "long_factor": [2.0] * 8}}
    with pytest.raises(CheckpointError, match=f"unsupported rope scaling type '{rope_type}'.*yarn"):
        parse_config(raw)
