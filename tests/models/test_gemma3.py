"""Gemma 3 text: the PyTorch reference matches transformers with a sliding window shorter than the context
(prefill, decode and verify crossing it), both rope config forms, tied and untied embeddings; a compiled bundle
reproduces transformers' greedy `generate` plainly and speculatively; ONNX Runtime matches the torch runner."""

import dataclasses
import types

import numpy as np
import pytest
import torch

from helpers import GEMMA3_WINDOW, make_checkpoint

from specrt.models.checkpoint import open_checkpoint
from specrt.core.errors import CheckpointError
from specrt.models import empty_past, parse_config
from specrt.models.layers import attend

CASES = ("gemma3", "gemma3_legacy", "gemma3_untied")
CONTEXT = 22  # > 3 windows


@pytest.fixture(scope="module", params=CASES)
def gemma_target(request, workdir, tokenizer_path):
    case = request.param
    return case, make_checkpoint(workdir / "gemma3" / case / "target", case, tokenizer_path, layers=3, seed=0)


def test_config_forms_parse_as_transformers_reads_them(gemma_target):
    import transformers

    case, path = gemma_target
    hf = transformers.AutoConfig.from_pretrained(path)
    ours = open_checkpoint(path).config
    assert ours.architecture == "Gemma3ForCausalLM" and ours.sliding_window == GEMMA3_WINDOW
    assert ours.layer_types == tuple(hf.layer_types) == ("sliding_attention", "full_attention", "sliding_attention")
    assert (ours.rope.theta, ours.rope.rope_type, ours.rope.factor) == (100000.0, "linear", 2.0)
    assert (ours.local_rope.theta, ours.local_rope.rope_type) == (10000.0, "default")
    assert ours.tie_word_embeddings == (case != "gemma3_untied") == hf.tie_word_embeddings
    assert (ours.query_pre_attn_scalar, ours.final_logit_softcapping) == (24, 8.0)


def _windowless(decoder):
    """The same weights and ropes with an unbounded window: proves the test context really crosses the window."""
    from specrt.models import build_decoder

    c = dataclasses.replace(decoder.config, sliding_window=1 << 20)
    other = build_decoder(c)
    other.load_state_dict(decoder.state_dict(), strict=False)
    return other.eval()


def test_reference_matches_transformers_across_the_window(gemma_target):
    import transformers

    case, path = gemma_target
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ours = open_checkpoint(path).load_decoder()
    ids = torch.randint(0, ours.config.vocab_size, (1, CONTEXT), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(CONTEXT)[None]
    with torch.no_grad():
        ref = hf(ids).logits
        k, v = empty_past(ours.config)
        full = ours(ids, pos, k, v)
        # prefill 9 (> window) -> decode 1 -> verify 7 with past -> decode 1 -> verify 4: every call crosses it
        logits, keys, values = [], list(k), list(v)
        for a, b in ((0, 9), (9, 10), (10, 17), (17, 18), (18, CONTEXT)):
            out = ours(ids[:, a:b], pos[:, a:b], tuple(keys), tuple(values))
            logits.append(out.logits)
            keys = [torch.cat((x, y), 1) for x, y in zip(keys, out.new_keys)]
            values = [torch.cat((x, y), 1) for x, y in zip(values, out.new_values)]
        chunked = torch.cat(logits, 1)
        windowless = _windowless(ours)(ids, pos, k, v).logits
    assert torch.allclose(full.logits, ref, atol=1e-4, rtol=1e-4), (full.logits - ref).abs().max()
    assert torch.allclose(chunked, ref, atol=1e-4, rtol=1e-4), (chunked - ref).abs().max()
    beyond = slice(GEMMA3_WINDOW, None)
    assert (windowless[:, beyond] - ref[:, beyond]).abs().max() > 1e-2  # the window changes the result
    assert torch.allclose(windowless[:, :GEMMA3_WINDOW], ref[:, :GEMMA3_WINDOW], atol=1e-4, rtol=1e-4)


def test_attend_window_and_softcap_match_transformers_eager():
    """`attend` (past/new split) equals transformers' Gemma eager attention with a sliding mask and soft-capping."""
    from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward

    gen = torch.Generator().manual_seed(0)
    p, s, hq, hkv, d, window, scale, cap = 11, 5, 4, 2, 8, 4, 0.3, 2.0
    q = torch.randn(1, s, hq, d, generator=gen)
    k = torch.randn(1, p + s, hkv, d, generator=gen)
    v = torch.randn(1, p + s, hkv, d, generator=gen)
    qpos = torch.arange(p, p + s)[:, None]
    kpos = torch.arange(p + s)[None, :]
    visible = (kpos <= qpos) & (kpos > qpos - window)
    mask = torch.zeros(1, 1, s, p + s).masked_fill(~visible, torch.finfo(torch.float32).min)
    module = types.SimpleNamespace(num_key_value_groups=hq // hkv, training=False)
    ref, _ = eager_attention_forward(module, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                                     scaling=scale, softcap=cap)
    ours = attend(q, k[:, :p], v[:, :p], k[:, p:], v[:, p:], scale, window=window, softcap=cap)
    assert torch.allclose(ours, ref.reshape(1, s, hq * d), atol=1e-5)
    plain = attend(q, k[:, :p], v[:, :p], k[:, p:], v[:, p:], scale)
    assert not torch.allclose(plain, ours, atol=1e-3)


def _real_config(**overrides):
    """The keys of Gemma 3 270M's config.json (transformers 4.55 era: layer_types plus the flat rope keys)."""
    raw = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "_sliding_window_pattern": 6,
           "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2,
           "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
           "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "intermediate_size": 2048,
           "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
           "max_position_embeddings": 32768, "num_attention_heads": 4, "num_hidden_layers": 18,
           "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
           "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
           "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144}
    raw.update(overrides)
    return {k: v for k, v in raw.items() if v != "drop"}


def test_real_gemma3_configs():
    c270 = parse_config(_real_config())
    assert c270.tie_word_embeddings and c270.sliding_window == 512 and c270.head_dim == 256
    assert [i for i, t in enumerate(c270.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert (c270.rope.theta, c270.local_rope.theta) == (1e6, 1e4)
    # Gemma 3 1B (transformers 4.50): no layer_types, `sliding_window_pattern` instead, no tie key
    c1b = parse_config(_real_config(layer_types="drop", _sliding_window_pattern="drop", sliding_window_pattern=6,
                                    num_hidden_layers=26, hidden_size=1152, eos_token_id=[1, 106]))
    assert [i for i, t in enumerate(c1b.layer_types) if t == "full_attention"] == [5, 11, 17, 23]
    # Gemma 3 4B text: linear rope scaling (factor 8) on the global layers only
    c4b = parse_config(_real_config(rope_scaling={"rope_type": "linear", "factor": 8.0}))
    assert (c4b.rope.rope_type, c4b.rope.factor, c4b.local_rope.rope_type) == ("linear", 8.0, "default")


@pytest.mark.parametrize("bad, message", [
    ({"use_bidirectional_attention": True}, "bidirectional"),
    ({"layer_types": ["sliding_attention"] * 17}, "18 layers"),
    ({"layer_types": ["chunked_attention"] * 18}, "unsupported layer_types"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "keyed by layer type"),
    ({"rope_scaling": {"rope_type": "mrope", "factor": 2.0}}, "unsupported rope scaling type 'mrope'"),
])
def test_bad_gemma3_configs_are_clear_errors(bad, message):
    with pytest.raises(CheckpointError, match=message):
        parse_config(_real_config(**bad))


@pytest.fixture(scope="module", params=("gemma3", "gemma3_legacy"))
def gemma_bundle(request, workdir, tokenizer_path):
    from specrt.compiler import CompileSpec, compile_bundle

    case = request.param
    base = workdir / "gemma3" / case
    target = make_checkpoint(base / "target_c", case, tokenizer_path, layers=3, seed=0)
    draft = make_checkpoint(base / "draft_c", case, tokenizer_path, layers=2, hidden=32, seed=5)
    # max_seq_len 96 > window 6: the window lives in the graph, so compile accepts it
    return case, target, compile_bundle(CompileSpec(target, base / "bundle", draft, max_seq_len=96, max_draft_tokens=6))


def test_greedy_matches_transformers_generate(gemma_bundle):
    import transformers

    from specrt.runtime import load

    case, target, bundle = gemma_bundle
    hf = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    gen = load(bundle, backend="ort")
    rejected = drafted_ngram = 0
    for prompt in ("def main(argv):\n    ", "import json\nimport json\nimport json\nimport"):
        ids = gen.tokenizer.encode(prompt)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=30, do_sample=False, eos_token_id=0,
                              pad_token_id=0)
        expected = out[0, len(ids):].tolist()
        for method, k in (("none", 0), ("ngram", 3), ("draft", 3), ("draft", 6)):
            res = gen.generate(prompt, 30, method=method, num_speculative_tokens=k)
            assert res.token_ids == expected, f"{case} {method} k={k}"
            if method == "draft":
                rejected += res.stats.drafted_tokens - res.stats.accepted_tokens
            if method == "ngram":
                drafted_ngram += res.stats.drafted_tokens
    assert rejected > 0 and drafted_ngram > 0  # the rejection path and the n-gram path both ran


def test_ort_matches_torch_runner_across_the_window(gemma_bundle):
    from specrt.runtime import load

    case, _, bundle = gemma_bundle
    ort_gen, torch_gen = load(bundle, backend="ort"), load(bundle, backend="torch")
    ids = np.random.default_rng(0).integers(0, ort_gen.vocab_size, size=40).astype(np.int64)
    for pair in ((ort_gen.target, torch_gen.target), (ort_gen.draft, torch_gen.draft)):
        for r in pair:
            r.reset()
        for chunk in (ids[:9], ids[9:10], ids[10:17], ids[17:18], ids[18:25]):
            a, b = (r.forward(chunk).copy() for r in pair)
            assert np.allclose(a, b, atol=1e-4, rtol=1e-4), f"{case}: max diff {np.abs(a - b).max()}"
        for r in pair:  # rollback below a window's worth of rows, then continue
            r.truncate(12)
        a, b = (r.forward(ids[30:36]).copy() for r in pair)
        assert np.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_compile_validates_a_verify_beyond_the_window():
    from specrt.compiler.validate import window_shapes

    c270 = parse_config(_real_config())
    assert window_shapes(c270, 1024, 4) == [(5, 515)]  # past 515 > window 512: the mask is exercised
    assert window_shapes(c270, 512, 4) == []  # the context never reaches past the window
    llama = dataclasses.replace(c270, layer_types=(), local_rope=None)
    assert window_shapes(llama, 1024, 4) == []


def test_embedding_scale_is_rounded_to_the_embedding_dtype_as_in_transformers():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    from specrt.models import build_decoder

    hidden = 40  # sqrt(40) = 6.3246 is 6.3125 in bf16
    c = parse_config(_real_config(hidden_size=hidden, vocab_size=300, num_hidden_layers=1, intermediate_size=8,
                                  head_dim=8, layer_types=["sliding_attention"]))
    ours = build_decoder(c).to(torch.bfloat16)
    ref = Gemma3TextScaledWordEmbedding(300, hidden, 0, embed_scale=hidden**0.5).to(torch.bfloat16)
    ref.weight.data.copy_(ours.model.embed_tokens.weight.data)
    ids = torch.arange(300)[None]
    with torch.no_grad():
        assert torch.equal(ours.embed(ids), ref(ids))
        assert not torch.equal(ours.embed(ids), (ours.model.embed_tokens(ids).float() * hidden**0.5).to(torch.bfloat16))
