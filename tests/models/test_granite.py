"""Granite 3 (GraniteForCausalLM): its four scalars parse as transformers reads them (released and default forms);
the PyTorch reference matches transformers; a compiled bundle (the fused graph: residual_multiplier folded into
o_proj / down_proj, the embedding and logits scaled, GQA's scale) reproduces transformers' greedy `generate`
plainly and speculatively on both runners."""

import json

import pytest

from helpers import assert_greedy_matches_transformers, assert_logits_match_transformers, make_checkpoint

from specrt.models import parse_config


@pytest.fixture(scope="module")
def granite_target(workdir, tokenizer_path):
    return make_checkpoint(workdir / "granite" / "target", "granite", tokenizer_path, layers=2, seed=0)


def test_released_and_default_configs():
    raw = {"architectures": ["GraniteForCausalLM"], "model_type": "granite", "hidden_size": 2048,
           "intermediate_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 5000000.0,
           "tie_word_embeddings": True, "vocab_size": 49155, "attention_multiplier": 0.015625,
           "embedding_multiplier": 12.0, "logits_scaling": 8.0, "residual_multiplier": 0.22}  # granite-3.1-2b
    c = parse_config(raw)
    assert (c.embedding_multiplier, c.residual_multiplier, c.attention_multiplier, c.logits_scaling) == (
        12.0, 0.22, 0.015625, 8.0)
    bare = parse_config({k: v for k, v in raw.items() if "multiplier" not in k and k != "logits_scaling"})
    assert (bare.embedding_multiplier, bare.residual_multiplier, bare.attention_multiplier, bare.logits_scaling) == (
        1.0, 1.0, 1.0, 1.0)  # transformers' GraniteConfig defaults (an attention scale of 1)


def test_reference_matches_transformers(granite_target):
    assert_logits_match_transformers(granite_target)


@pytest.mark.slow  # a compile (~40 s on 2 loaded cores)
def test_greedy_matches_transformers_generate(granite_target, tmp_path):
    from specrt.compiler import CompileSpec, compile_bundle

    bundle = compile_bundle(CompileSpec(granite_target, tmp_path / "bundle", max_seq_len=96, max_draft_tokens=4))
    assert "fused" in json.loads((bundle / "manifest.json").read_text())["models"]["target"]["graphs"]
    assert_greedy_matches_transformers(granite_target, bundle, ("none", "ngram", "auto"), ("ort", "torch"))
