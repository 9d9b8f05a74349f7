"""Medusa heads: compile --medusa, then greedy output equal to plain decoding for every k."""

import json

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def medusa_generator(workdir, llama_target):
    from safetensors.torch import save_file

    from specrt.compiler import compile_bundle
    from specrt.compiler.medusa import medusa_step
    from specrt.runtime import load

    heads_dir = workdir / "medusa_heads"
    heads_dir.mkdir(exist_ok=True)
    cfg = json.loads((llama_target / "config.json").read_text())
    d, heads = cfg["hidden_size"], 3
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(heads):
        tensors[f"heads.{i}.weight"] = torch.randn(d, d, generator=gen) * 0.05
        tensors[f"heads.{i}.bias"] = torch.zeros(d)
    save_file(tensors, str(heads_dir / "medusa.safetensors"))
    (heads_dir / "medusa_config.json").write_text(json.dumps({
        "medusa_num_heads": heads, "medusa_num_layers": 1, "hidden_size": d, "vocab_size": cfg["vocab_size"],
        "shares_target_lm_head": True}))
    bundle = compile_bundle(llama_target, workdir / "bundles" / "medusa", max_seq_len=128, max_draft_tokens=6,
                            extra_steps=[medusa_step(heads_dir, llama_target)])
    return load(bundle, backend="ort")


@pytest.mark.parametrize("k", [1, 2, 3, 6, "auto"])
def test_medusa_greedy_equals_plain(medusa_generator, k):
    prompt = "def main(argv):\n    "
    plain = medusa_generator.generate(prompt, 40, method="none")
    spec = medusa_generator.generate(prompt, 40, method="medusa", num_speculative_tokens=k)
    assert spec.token_ids == plain.token_ids
    if k != "auto":
        assert spec.stats.drafted_tokens > 0
        assert max(spec.stats.k_history) <= 3  # one draft per head


def test_medusa_heads_match_reference(medusa_generator, workdir, llama_target):
    """The compiled heads graph == lm_head(h + silu(W_i h + b_i)) computed from the saved weights."""
    from safetensors.torch import load_file

    from specrt.models.checkpoint import open_checkpoint
    from specrt.runtime.proposers.medusa import MedusaHeadsRunner

    heads = MedusaHeadsRunner(medusa_generator.manifest.path("medusa/heads.onnx"))
    h = torch.randn(2, medusa_generator.target.config.hidden_size, generator=torch.Generator().manual_seed(1))
    out = heads(h.numpy())
    w = load_file(str(workdir / "medusa_heads" / "medusa.safetensors"))
    lm = open_checkpoint(llama_target).load_decoder().lm_head_weight().detach()
    for i in range(3):
        ref = (h + torch.nn.functional.silu(h @ w[f"heads.{i}.weight"].T + w[f"heads.{i}.bias"])) @ lm.T
        assert np.allclose(out[:, i], ref.numpy(), atol=1e-4)


def test_medusa_sampling_valid(medusa_generator):
    res = medusa_generator.generate("import os", 20, method="medusa", temperature=0.7, seed=3,
                                    num_speculative_tokens=3)
    assert 1 <= len(res.token_ids) <= 20
