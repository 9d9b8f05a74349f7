"""The PyTorch reference matches Hugging Face transformers on every supported architecture, and the whole
pipeline (compile -> ONNX Runtime -> speculative loop) reproduces transformers' greedy `generate`."""

import numpy as np
import pytest
import torch

from helpers import ARCH_CASES, make_checkpoint

from specrt.models.checkpoint import open_checkpoint
from specrt.models import empty_past


@pytest.fixture(scope="module", params=ARCH_CASES)
def arch_checkpoints(request, workdir, tokenizer_path, llama_draft):
    """A random 2-layer target of `arch` and the session's unrelated 1-layer Llama draft (same tokenizer): most
    drafts are rejected, so every architecture's graphs roll back; the draft's export is shared (export_cache)."""
    arch = request.param
    base = workdir / "arch" / arch
    target = make_checkpoint(base / "target", arch, tokenizer_path, layers=2, seed=0, shards=(arch == "llama"))
    return arch, target, llama_draft


def test_reference_matches_transformers(arch_checkpoints):
    import transformers

    arch, target, _ = arch_checkpoints
    hf = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    ours = open_checkpoint(target).load_decoder()
    ids = torch.randint(0, ours.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
        k, v = empty_past(ours.config)
        full = ours(ids, torch.arange(24)[None], k, v)
        # the same sequence in two calls through the cache: prefill 17 + verify 7
        a = ours(ids[:, :17], torch.arange(17)[None], k, v)
        b = ours(ids[:, 17:], torch.arange(17, 24)[None], a.new_keys, a.new_values)
    assert torch.allclose(full.logits, ref, atol=1e-4, rtol=1e-4), (full.logits - ref).abs().max()
    assert torch.allclose(b.logits, ref[:, 17:], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def arch_bundle(arch_checkpoints, workdir):
    from specrt.compiler import CompileSpec, compile_bundle

    arch, target, draft = arch_checkpoints
    return arch, target, compile_bundle(CompileSpec(target, workdir / "arch" / arch / "bundle", draft, max_seq_len=96,
                                        max_draft_tokens=6))


@pytest.mark.slow  # a compile per architecture (~6 s each on 2 cores): the fast lane keeps the reference checks
def test_greedy_matches_transformers_generate(arch_bundle):
    import transformers

    from specrt.runtime import load

    arch, target, bundle = arch_bundle
    hf = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    gens = {backend: load(bundle, backend=backend) for backend in ("ort", "ort-portable")}
    assert gens["ort-portable"].target.describe().get("graph") is None
    assert (gens["ort"].target.describe().get("graph") == "fused") == (arch != "gpt2")
    for prompt in ("def main(argv):\n    ", "import json\n"):
        ids = gens["ort"].tokenizer.encode(prompt)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=0,
                              pad_token_id=0)
        expected = out[0, len(ids):].tolist()
        for backend, gen in gens.items():
            for method, k in (("none", 0), ("draft", 3), ("draft", 6), ("ngram", 4)):
                res = gen.generate(prompt, 24, method=method, num_speculative_tokens=k)
                assert res.token_ids == expected, f"{arch} {backend} {method} k={k}"


@pytest.mark.slow
def test_fused_graph_variant_in_manifest(arch_bundle):
    from specrt.bundle.manifest import read_manifest

    arch, _, bundle = arch_bundle
    for role, entry in read_manifest(bundle).models.items():
        assert entry.graphs["portable"].onnx == entry.onnx
        if arch == "gpt2" and role == "target":  # the draft is a Llama
            assert "fused" not in entry.graphs and "GPT2" in entry.fused_skipped
        else:
            fused = entry.graphs["fused"]
            assert fused.onnx == f"{role}/model.fused.onnx" and fused.validation["max_abs_diff"] < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ort", "ort-portable"])
def test_ort_matches_torch_reference(arch_bundle, backend):
    """Every backend (both ONNX Runtime graph variants) matches the PyTorch reference: logits through prefill,
    decode and verify calls, rollback, and the last-row-only prefill form."""
    from specrt.runtime import load

    arch, _, bundle = arch_bundle
    ort_gen, torch_gen = load(bundle, backend=backend), load(bundle, backend="torch")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, ort_gen.vocab_size, size=40).astype(np.int64)
    for runner_pair in ((ort_gen.target, torch_gen.target), (ort_gen.draft, torch_gen.draft)):
        for r in runner_pair:
            r.reset()
        for chunk in (ids[:20], ids[20:21], ids[21:28], ids[28:29]):
            a, b = (r.forward(chunk).copy() for r in runner_pair)
            assert np.allclose(a, b, atol=1e-4, rtol=1e-4), f"{arch}: max diff {np.abs(a - b).max()}"
        for r in runner_pair:  # rollback, then continue from the shorter prefix
            r.truncate(22)
        a, b = (r.forward(ids[30:33]).copy() for r in runner_pair)
        assert np.allclose(a, b, atol=1e-4, rtol=1e-4)
        a, b = (r.forward_last(ids[33:38]).copy() for r in runner_pair)
        assert a.shape == (ort_gen.vocab_size,) and np.allclose(a, b, atol=1e-4, rtol=1e-4)
        a, b = (r.forward(ids[38:39]).copy() for r in runner_pair)  # the cache after forward_last is right
        assert all(r.length == 31 for r in runner_pair) and np.allclose(a, b, atol=1e-4, rtol=1e-4)
