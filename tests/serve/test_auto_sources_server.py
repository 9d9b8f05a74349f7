"""`speculative.auto_sources` over HTTP (runtime/proposers/auto_sources.py): method auto's sources per request, on
the one-request loop and on the batch; greedy text unchanged; a bad or unavailable source is a 400 naming the field."""

from __future__ import annotations

import httpx
import pytest

from serve_helpers import serving


def _complete(server, **speculative):
    return httpx.post(f"{server.url}/v1/completions", timeout=120, json={
        "prompt": "the cat sat on the mat and the cat sat on the", "max_tokens": 8, "temperature": 0,
        "speculative": speculative})


@pytest.mark.parametrize("max_batch", [0, 2])
def test_auto_sources_per_request(target_only_bundle, max_batch):
    with serving(str(target_only_bundle), max_batch=max_batch, backend="ort") as server:
        plain = _complete(server, method="none")
        assert plain.status_code == 200, plain.text
        for sources in ("ngram", ["recycle"], "-recycle"):
            r = _complete(server, method="auto", auto_sources=sources)
            assert r.status_code == 200, (sources, r.text)
            assert r.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
            assert r.json()["speculative_stats"]["method"] == "auto"
        for sources, says in (("bogus", "unknown auto source 'bogus'"),
                              ("head", "auto source 'head' is not available with this bundle")):
            r = _complete(server, method="auto", auto_sources=sources)
            assert r.status_code == 400 and says in r.text, r.text
            assert r.json()["error"]["param"] == "speculative.auto_sources"
        r = _complete(server, method="ngram", auto_sources="ngram")
        assert r.status_code == 400 and "applies to method 'auto'" in r.text
