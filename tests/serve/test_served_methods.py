"""Issue 49 #6 and #10 over HTTP: the methods /v1/models advertises are exactly those a request may name (draft
head bundles included), and `speculative_stats.num_speculative_tokens` is the k the request's steps drafted with."""

from __future__ import annotations

import httpx
import pytest

from serve_helpers import serving


@pytest.fixture(scope="module")
def head_bundle(workdir, tokenizer_path):
    """A one-layer target with a (random) draft head: methods head and hybrid-head."""
    import torch

    from helpers import make_checkpoint
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.draft_head import DraftHead, save_head

    base = workdir / "served_methods_head"
    target = make_checkpoint(base / "target", "llama", tokenizer_path, layers=1, seed=5)
    decoder = open_checkpoint(target).load_decoder(torch.float32)
    torch.manual_seed(0)
    save_head(DraftHead(decoder, torch.arange(decoder.config.vocab_size)), base / "head")
    return compile_bundle(CompileSpec(target, base / "bundle", f"head:{base / 'head'}", max_seq_len=96,
                                      max_draft_tokens=4))


def _complete(server, method, **extra):
    return httpx.post(f"{server.url}/v1/completions", timeout=120, json={
        "prompt": "def main(argv):", "max_tokens": 6, "temperature": 0,
        "speculative": {"method": method, **extra}})


@pytest.mark.parametrize("max_batch", [0, 2])
def test_every_advertised_method_is_accepted_and_no_other(head_bundle, max_batch):
    with serving(str(head_bundle), max_batch=max_batch, backend="ort") as server:
        advertised = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["speculative_methods"]
        assert {"head", "hybrid-head"} <= set(advertised)
        texts = set()
        for method in advertised:
            r = _complete(server, method, num_speculative_tokens=3)
            assert r.status_code == 200, (method, r.text)
            assert r.json()["speculative_stats"]["method"] == method
            texts.add(r.json()["choices"][0]["text"])
        assert len(texts) == 1  # greedy: the same text whatever the method
        r = _complete(server, "medusa")  # not in this bundle
        assert r.status_code == 400 and "speculative.method" in r.text and "hybrid-head" in r.text
        schema = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
        assert sorted(_methods_in(schema)) == sorted(advertised)


def _methods_in(schema):
    spec = schema["components"]["schemas"]["SpeculativeOptions"]["properties"]["method"]
    for option in spec.get("anyOf", [spec]):
        if "enum" in option:
            return option["enum"]
    raise AssertionError(spec)


def test_reported_k_under_batching_is_the_largest_k_drafted_with(pair_bundle):
    """Under batching a seeded request keeps its own k schedule (a fixed 5, fewer as the end nears): the last
    steps draft fewer than 5 (they were reported before: 0 for a request that asked for 5), the first ones 5."""
    with serving(str(pair_bundle), max_batch=2, backend="ort") as server:
        body = {"prompt": "def main(argv):", "max_tokens": 12, "temperature": 1.0, "seed": 0,
                "speculative": {"method": "draft", "num_speculative_tokens": 5}}
        stats = httpx.post(f"{server.url}/v1/completions", timeout=120, json=body).json()["speculative_stats"]
        assert stats["drafted_tokens"] > 0 and stats["num_speculative_tokens"] == 5
        plain = httpx.post(f"{server.url}/v1/completions", timeout=120, json={
            **body, "speculative": {"method": "none"}}).json()["speculative_stats"]
        assert plain["num_speculative_tokens"] == 0
