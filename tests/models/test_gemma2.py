"""Gemma 2 (Gemma2ForCausalLM): configs parse as transformers reads them (released and default forms); the PyTorch
reference matches transformers with soft-capped attention scores and a sliding window shorter than the context
(prefill, decode and verify crossing it); a compiled bundle reproduces transformers' greedy `generate` plainly,
with n-gram chains, `auto` and a draft model, and ONNX Runtime matches the torch runner on chains and a token tree
(tree masks against each path as a chain: tests/runtime/test_tree_graph.py)."""

import numpy as np
import pytest
import torch

from helpers import GEMMA3_WINDOW, assert_greedy_matches_transformers, make_checkpoint

from specrt.core.errors import CheckpointError
from specrt.models import empty_past, parse_config
from specrt.models.checkpoint import open_checkpoint

CONTEXT = 22  # > 3 windows


@pytest.fixture(scope="module")
def gemma2_target(workdir, tokenizer_path):
    return make_checkpoint(workdir / "gemma2" / "target", "gemma2", tokenizer_path, layers=3, seed=0)


def test_config_parses_as_transformers_reads_it(gemma2_target):
    import transformers

    hf = transformers.AutoConfig.from_pretrained(gemma2_target)
    ours = open_checkpoint(gemma2_target).config
    assert ours.architecture == "Gemma2ForCausalLM" and ours.sliding_window == GEMMA3_WINDOW
    assert ours.layer_types == tuple(hf.layer_types) == ("sliding_attention", "full_attention", "sliding_attention")
    assert not ours.qk_norm and ours.local_rope is None and ours.tie_word_embeddings
    assert (ours.query_pre_attn_scalar, ours.attn_logit_softcapping, ours.final_logit_softcapping) == (24, 1.5, 8.0)


def _released_config(**overrides):
    """The keys of gemma-2-2b-it's config.json (transformers 4.42 era)."""
    raw = {"architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
           "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 256,
           "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
           "initializer_range": 0.02, "intermediate_size": 9216, "max_position_embeddings": 8192,
           "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
           "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
           "sliding_window": 4096, "torch_dtype": "float32", "use_cache": True, "vocab_size": 256000}
    raw.update(overrides)
    return {k: v for k, v in raw.items() if v != "drop"}


def test_released_config():
    c = parse_config(_released_config())
    assert (c.attn_logit_softcapping, c.final_logit_softcapping, c.sliding_window) == (50.0, 30.0, 4096)
    assert [i for i, t in enumerate(c.layer_types) if t == "full_attention"] == list(range(1, 26, 2))
    assert (c.rope.theta, c.rope.rope_type, c.head_dim, c.qk_norm) == (10000.0, "default", 256, False)
    # keys a config leaves out take transformers' Gemma2Config defaults
    bare = parse_config(_released_config(attn_logit_softcapping="drop", final_logit_softcapping="drop",
                                         rope_theta="drop", sliding_window="drop"))
    assert (bare.attn_logit_softcapping, bare.final_logit_softcapping, bare.rope.theta, bare.sliding_window) == (
        50.0, 30.0, 10000.0, 4096)


def test_bad_gemma2_configs_are_clear_errors():
    with pytest.raises(CheckpointError, match="bidirectional"):
        parse_config(_released_config(use_bidirectional_attention=True))
    with pytest.raises(CheckpointError, match="26 layers"):
        parse_config(_released_config(layer_types=["sliding_attention"] * 25))


def test_reference_matches_transformers_across_the_window(gemma2_target):
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma2_target).eval()
    ours = open_checkpoint(gemma2_target).load_decoder()
    ids = torch.randint(0, ours.config.vocab_size, (1, CONTEXT), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(CONTEXT)[None]
    with torch.no_grad():
        ref = hf(ids).logits
        k, v = empty_past(ours.config)
        logits, keys, values = [], list(k), list(v)
        for a, b in ((0, 9), (9, 10), (10, 17), (17, 18), (18, CONTEXT)):  # every call crosses the window
            out = ours(ids[:, a:b], pos[:, a:b], tuple(keys), tuple(values))
            logits.append(out.logits)
            keys = [torch.cat((x, y), 1) for x, y in zip(keys, out.new_keys)]
            values = [torch.cat((x, y), 1) for x, y in zip(values, out.new_values)]
        chunked = torch.cat(logits, 1)
        uncapped = _without_score_cap(ours)(ids, pos, k, v).logits
    assert torch.allclose(chunked, ref, atol=1e-4, rtol=1e-4), (chunked - ref).abs().max()
    assert (uncapped - ref).abs().max() > 1e-2  # the scores' soft-cap changes the result


def _without_score_cap(decoder):
    import dataclasses

    from specrt.models import build_decoder

    other = build_decoder(dataclasses.replace(decoder.config, attn_logit_softcapping=None))
    other.load_state_dict(decoder.state_dict())
    return other.eval()


@pytest.fixture(scope="module")
def gemma2_bundle(workdir, tokenizer_path, gemma2_target):
    from specrt.compiler import CompileSpec, compile_bundle

    draft = make_checkpoint(workdir / "gemma2" / "draft", "gemma2", tokenizer_path, layers=2, hidden=32, seed=5)
    return compile_bundle(CompileSpec(gemma2_target, workdir / "gemma2" / "bundle", draft, max_seq_len=96,
                                      max_draft_tokens=6))


@pytest.mark.slow  # two compiles (~1 min on 2 loaded cores)
def test_greedy_matches_transformers_generate(gemma2_target, gemma2_bundle):
    assert_greedy_matches_transformers(gemma2_target, gemma2_bundle, ("none", "ngram", "auto", "draft"), new_tokens=30)


@pytest.mark.slow
def test_ort_matches_torch_runner_across_the_window(gemma2_bundle):
    from specrt.runtime import load

    ort_gen, torch_gen = load(gemma2_bundle, backend="ort"), load(gemma2_bundle, backend="torch")
    ids = np.random.default_rng(0).integers(0, ort_gen.vocab_size, size=40).astype(np.int64)
    for pair in ((ort_gen.target, torch_gen.target), (ort_gen.draft, torch_gen.draft)):
        for r in pair:
            r.reset()
        for chunk in (ids[:9], ids[9:10], ids[10:17], ids[17:18], ids[18:25]):
            a, b = (r.forward(chunk).copy() for r in pair)
            assert np.allclose(a, b, atol=1e-4, rtol=1e-4), f"max diff {np.abs(a - b).max()}"
        tree = np.array([-1, -1, 0, 0, 1], dtype=np.int64)  # root + 5 drafts in branches: siblings masked
        a, b = (r.forward(ids[25:31], tree).copy() for r in pair)
        assert np.allclose(a, b, atol=1e-4, rtol=1e-4), f"tree: max diff {np.abs(a - b).max()}"
