"""Config variations of published checkpoints (hub-style config.json) compile to bundles whose greedy output is
transformers' own, or are refused with one line before anything is written."""

from __future__ import annotations

import pytest

from hub_checkpoint import gpt2_config, hf_greedy, hub_checkpoint

PROMPTS = ("def main(argv):\n    ", "import json\n")


def vocab(tokenizer_path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_path)).get_vocab_size()


def assert_greedy_matches(checkpoint, bundle_dir, new_tokens: int = 24, methods=("none", "ngram")):
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.runtime import load

    bundle = compile_bundle(CompileSpec(checkpoint, bundle_dir, max_seq_len=64, max_draft_tokens=4))
    gen = load(bundle, backend="ort")
    for prompt in PROMPTS:
        ids = gen.tokenizer.encode(prompt)
        expected = hf_greedy(checkpoint, ids, new_tokens)
        for method in methods:
            got = gen.generate(prompt, new_tokens, method=method, temperature=0.0).token_ids
            assert got == expected, f"{checkpoint.name} {method}: {got} != {expected}"


def test_gpt2_unscaled_and_layer_scaled_attention(tmp_path, tokenizer_path):
    """scale_attn_weights false (scores not divided by sqrt(head_dim)) with scale_attn_by_inverse_layer_idx (divided
    by layer index + 1, as in Stanford CRFM's GPT-2s): compiled before as plain GPT-2 (wrong output) / refused."""
    raw = gpt2_config(vocab(tokenizer_path), scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True)
    assert_greedy_matches(hub_checkpoint(tmp_path / "gpt2", raw, tokenizer_path), tmp_path / "bundle")
