"""Phi-3 (Phi3ForCausalLM): released config forms parse as transformers reads them (the default rope, longrope and
its older names, a sliding window); fused qkv_proj / gate_up_proj weights load into the Llama module; the PyTorch
reference matches transformers (default rope and longrope); a compiled bundle reproduces transformers' greedy
`generate` plainly and speculatively; what transformers would compute differently is refused at compile."""

import json
import math
import shutil

import pytest
import torch

from helpers import assert_greedy_matches_transformers, assert_logits_match_transformers, make_checkpoint

from specrt.core.errors import CheckpointError
from specrt.models import parse_config
from specrt.models.checkpoint import open_checkpoint

CONTEXT = 40  # < the longrope case's original_max_position_embeddings (64)


@pytest.fixture(scope="module", params=("phi3", "phi3_longrope", "phi3_partial"))
def phi3_target(request, workdir, tokenizer_path):
    case = request.param
    hidden = 128 if case == "phi3_partial" else 64  # head_dim 32, the rope on 16: a fused graph (cos / sin width 8)
    return case, make_checkpoint(workdir / "phi3" / case, case, tokenizer_path, layers=2, hidden=hidden, seed=0)


def _released(**overrides):
    """Phi-3-mini-4k-instruct's config.json keys."""
    raw = {"architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
           "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
           "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
           "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
           "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32064}
    raw.update(overrides)
    return raw


def test_released_configs():
    mini4k = parse_config(_released())
    assert (mini4k.rope.rope_type, mini4k.sliding_window, mini4k.head_dim, mini4k.family) == ("default", 2047, 96,
                                                                                                "llama")
    factors = {"short_factor": [1.0 + i / 100 for i in range(48)], "long_factor": [4.0] * 48}
    for name in ("longrope", "su", "yarn"):  # Phi-3.5 mini / Phi-3 mini 128k (older "su"; Phi3Config maps "yarn")
        c = parse_config(_released(max_position_embeddings=131072, sliding_window=262144,
                                   rope_scaling={"type": name, **factors}))
        assert c.rope.rope_type == "longrope" and c.rope.short_factor == tuple(factors["short_factor"])
        assert math.isclose(c.rope.attention_factor, math.sqrt(1 + math.log(32) / math.log(4096)))
        assert c.rope.original_max_position_embeddings == 4096
    # Phi-4 mini: the rope turns 96 of each head's 128 dimensions, tied embeddings
    phi4 = parse_config(_released(hidden_size=3072, num_attention_heads=24, num_key_value_heads=8,
                                  partial_rotary_factor=0.75, tie_word_embeddings=True, sliding_window=262144,
                                  max_position_embeddings=131072, rope_scaling={"type": "longrope",
                                  "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}))
    assert (phi4.head_dim, phi4.rotary_dim, phi4.partial_rotary_factor) == (128, 96, 0.75)


@pytest.mark.parametrize("overrides, message", [
    ({"partial_rotary_factor": 0.7}, "partial_rotary_factor 0.7 turns 67 of head_dim 96"),
    ({"partial_rotary_factor": 0}, r"partial_rotary_factor must be in \(0, 1\]"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 47, "long_factor": [1.0] * 48}},
     "short_factor has 47 values, head_dim 96 needs 48"),
    ({"partial_rotary_factor": 0.5, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48,
                                                     "long_factor": [1.0] * 48}},
     "short_factor has 48 values, head_dim 96 x partial_rotary_factor 0.5 needs 24"),
    ({"rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48}}, "short_factor"),
])
def test_what_is_not_supported_is_one_clear_error(overrides, message):
    with pytest.raises(CheckpointError, match=message):
        parse_config(_released(**overrides))


@pytest.mark.parametrize("where", ["top level", "rope_parameters"])
def test_a_partial_rope_is_refused_where_transformers_turns_whole_heads(where):
    raw = {**_released(), "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_scaling": None}
    if where == "top level":
        raw["partial_rotary_factor"] = 0.5
    else:  # as transformers 5 writes it
        raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    with pytest.raises(CheckpointError, match="partial_rotary_factor 0.5 .* not supported for LlamaForCausalLM"):
        parse_config(raw)


def test_config_and_weights_load_as_transformers_reads_them(phi3_target):
    import transformers

    case, path = phi3_target
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ours = open_checkpoint(path).load_decoder()
    layer, theirs = ours.model.layers[0], hf.model.layers[0]
    q, k, v = (getattr(layer.self_attn, f"{n}_proj").weight for n in "qkv")
    assert torch.equal(torch.cat([q, k, v]), theirs.self_attn.qkv_proj.weight)
    assert torch.equal(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
                       theirs.mlp.gate_up_proj.weight)
    assert ours.config.rope.rope_type == ("default" if case == "phi3" else "longrope")
    assert ours.config.rotary_dim == 16


def test_reference_matches_transformers(phi3_target):
    assert_logits_match_transformers(phi3_target[1], CONTEXT)


def test_bad_fused_weight_is_one_clear_error(tmp_path, workdir, tokenizer_path):
    from safetensors.torch import load_file, save_file

    src = make_checkpoint(workdir / "phi3" / "bad_src", "phi3", tokenizer_path, layers=2, seed=0)
    bad = shutil.copytree(src, tmp_path / "bad")
    tensors = load_file(str(bad / "model.safetensors"))
    name = "model.layers.1.self_attn.qkv_proj.weight"
    tensors[name] = tensors[name][:-8]
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"weight model.layers.1.self_attn.qkv_proj.weight has shape \(120, 64\), "
                                              r"config.json implies \(128, 64\)"):
        open_checkpoint(bad).load_decoder()


@pytest.mark.slow  # two compiles (~1 min on 2 loaded cores)
def test_greedy_matches_transformers_generate(phi3_target, tmp_path):
    from specrt.compiler import CompileSpec, compile_bundle

    case, path = phi3_target
    bundle = compile_bundle(CompileSpec(path, tmp_path / "bundle", max_seq_len=64, max_draft_tokens=4))
    assert_greedy_matches_transformers(path, bundle, ("none", "ngram", "auto"), ("ort", "torch"))
    if case != "phi3":  # longrope: past original_max_position_embeddings transformers uses the long factors
        with pytest.raises(CheckpointError, match="pass --max-seq-len <= 64"):
            compile_bundle(CompileSpec(path, tmp_path / "long", max_seq_len=65))
        assert not (tmp_path / "long").exists()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["models"]["target"]["architecture"] == "Phi3ForCausalLM"
    assert "fused" in manifest["models"]["target"]["graphs"]  # the partial rope too: GQA's narrower cos / sin


def test_a_partial_rope_gqa_cannot_run_falls_back_to_the_portable_graph():
    from specrt.compiler.fused_graph import fused_unsupported_reason

    c = parse_config(_released(partial_rotary_factor=0.25))  # 24 of 96: a cos / sin width of 12
    assert "turns 24 of 96 dimensions" in fused_unsupported_reason(c)
    assert fused_unsupported_reason(parse_config(_released(partial_rotary_factor=0.5))) is None  # 48: width 24
