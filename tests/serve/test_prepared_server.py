"""Issue 50 #2 through the server: a request served on the batch (`--max-batch`) is resolved once, its method checked
once against the bundle and once by the batch, its prompt ids validated once, its context checked once (before:
three, four or five, two and three times). Real HTTP, real engine, real ONNX Runtime sessions."""

from __future__ import annotations

import httpx

from serve_helpers import serving
from helpers import resolve_counts


def test_a_batched_server_request_is_resolved_once(pair_bundle, pair_generator, monkeypatch):
    ref = pair_generator.generate("def load(path):\n", 6, temperature=0, method="ngram").text
    with serving(str(pair_bundle), max_batch=2, method="ngram", served_model_name="tiny", backend="ort") as server, \
            resolve_counts(monkeypatch) as counts:  # spies set after the server's start-up
        r = httpx.post(f"{server.url}/v1/completions", timeout=120,
                       json={"model": "tiny", "prompt": "def load(path):\n", "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == ref
        assert counts == dict(request=1, check_for=1, prompt_ids=1, context=1, batch_check=1)
        # the server's own words for a prompt past the context, from the one context check
        r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": "def load(path):\n", "max_tokens": 10**4})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "max_tokens" and err["code"] == "context_length_exceeded"
        assert "maximum context length" in err["message"]
