"""SmolLM3 (SmolLM3ForCausalLM): the layers without rope ("NoPE") parse as transformers reads them (explicit flags
and the interval default); the PyTorch reference matches transformers; a compiled bundle reproduces transformers'
greedy `generate` plainly and speculatively on both runners (the fused graph runs GroupQueryAttention without
rotary on those layers; token trees against chains: tests/runtime/test_tree_graph.py)."""

import json

import pytest

from helpers import assert_greedy_matches_transformers, assert_logits_match_transformers, make_checkpoint

from specrt.core.errors import CheckpointError
from specrt.models import parse_config


@pytest.fixture(scope="module")
def smollm3_target(workdir, tokenizer_path):
    return make_checkpoint(workdir / "smollm3" / "target", "smollm3", tokenizer_path, layers=4, seed=0)


def _released(**overrides):
    """SmolLM3-3B's config.json keys (the ones the decoder reads)."""
    raw = {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_size": 2048,
           "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
           "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-06, "rope_theta": 5000000.0,
           "rope_scaling": None, "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": None,
           "no_rope_layer_interval": 4, "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)],
           "vocab_size": 128256, "bos_token_id": 128000, "eos_token_id": 128012, "pad_token_id": 128004}
    raw.update(overrides)
    return {k: v for k, v in raw.items() if v != "drop"}


def test_released_config():
    c = parse_config(_released())
    assert c.nope_layers == tuple(range(3, 36, 4)) and c.family == "llama" and c.tie_word_embeddings
    assert parse_config(_released(no_rope_layers="drop")).nope_layers == c.nope_layers  # the interval default
    assert parse_config(_released(no_rope_layers="drop", no_rope_layer_interval=6)).nope_layers == tuple(
        range(5, 36, 6))


@pytest.mark.parametrize("overrides, message", [
    ({"use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window=true is not supported"),
    ({"no_rope_layers": [1] * 35}, "one 0 / 1 flag for each of the 36 layers"),
    ({"no_rope_layers": [2] * 36}, "one 0 / 1 flag"),
])
def test_bad_configs_are_one_clear_error(overrides, message):
    with pytest.raises(CheckpointError, match=message):
        parse_config(_released(**overrides))


def test_reference_matches_transformers(smollm3_target):
    assert assert_logits_match_transformers(smollm3_target).config.nope_layers == (3,)


@pytest.mark.slow  # a compile (~40 s on 2 loaded cores)
def test_greedy_matches_transformers_generate(smollm3_target, tmp_path):
    from specrt.compiler import CompileSpec, compile_bundle

    bundle = compile_bundle(CompileSpec(smollm3_target, tmp_path / "bundle", max_seq_len=96, max_draft_tokens=4))
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert "fused" in manifest["models"]["target"]["graphs"]
    assert_greedy_matches_transformers(smollm3_target, bundle, ("none", "ngram", "auto"), ("ort", "torch"))
