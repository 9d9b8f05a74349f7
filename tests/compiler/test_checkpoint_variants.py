"""Config variations of published checkpoints (hub-style config.json) compile to bundles whose greedy output is
transformers' own, or are refused with one line before anything is written."""

from __future__ import annotations

import re

import pytest

from helpers import run_cli
from hub_checkpoint import gpt2_config, hf_greedy, hub_checkpoint, llama_config, qwen2_config

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


@pytest.mark.slow  # a compile and a generation through the CLI (~10 s)
def test_gpt2_unscaled_and_layer_scaled_attention(tmp_path, tokenizer_path):
    """scale_attn_weights false (scores not divided by sqrt(head_dim)) with scale_attn_by_inverse_layer_idx (divided
    by layer index + 1, as in Stanford CRFM's GPT-2s): compiled before as plain GPT-2 (wrong output) / refused."""
    raw = gpt2_config(vocab(tokenizer_path), scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True)
    assert_greedy_matches(hub_checkpoint(tmp_path / "gpt2", raw, tokenizer_path), tmp_path / "bundle")


@pytest.mark.slow  # a compile and a generation through the CLI (~6 s)
def test_qwen25_with_yarn_in_bf16(tmp_path, tokenizer_path):
    """Qwen2.5's documented long-context setting (rope_scaling yarn, factor 4) on a bf16 checkpoint: the yarn
    frequencies and attention factor reach both graphs (the fused graph's rope caches too); was refused."""
    raw = qwen2_config(vocab(tokenizer_path), rope_scaling={"type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 32})
    ck = hub_checkpoint(tmp_path / "qwen", raw, tokenizer_path, dtype="bfloat16")
    assert_greedy_matches(ck, tmp_path / "bundle")


@pytest.mark.parametrize("case", ["dynamic_rope_past_its_length", "olmo", "longrope_past_its_length"])
def test_refused_with_one_line_and_nothing_written(tmp_path, tokenizer_path, case):
    over, expected = {
        "dynamic_rope_past_its_length": ({"rope_scaling": {"type": "dynamic", "factor": 2.0},
                                          "max_position_embeddings": 64}, r"dynamic \(NTK\).*--max-seq-len <= 64"),
        "olmo": ({"architectures": ["OlmoForCausalLM"], "model_type": "olmo", "pad_token_id": None},
                 "unsupported architecture OlmoForCausalLM"),
        "longrope_past_its_length": ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8,
                                                       "long_factor": [2.0] * 8},
                                      "original_max_position_embeddings": 64, "max_position_embeddings": 256},
                                     r"longrope scaling.*long factors.*--max-seq-len <= 64"),
    }[case]
    ck = hub_checkpoint(tmp_path / "ck", llama_config(vocab(tokenizer_path), **over), tokenizer_path)
    out = tmp_path / "out"
    r = run_cli("compile", "--target", ck, "-o", out, "--max-seq-len", 128)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert re.search(expected, r.stderr) and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no output, no temporary left
