"""A stop string reached inside a speculative step: usage and logprobs count the tokens up to the one that
completed it, streamed or not, whatever the method (plain decoding's count), through the real server."""

from __future__ import annotations

import pytest

from serve_helpers import openai_client, serving

PROMPT = "import os\nimport sys\n"
N = 24


@pytest.fixture(scope="module")
def self_served(self_bundle):
    """The target as its own draft (every draft accepted): at k = 4 every step carries 5 tokens."""
    from specrt.serve import load_generators

    gens = load_generators(self_bundle, max_concurrency=1, backend="ort", threads=2)
    with serving(gens, max_queue=8, served_model_name="self", num_speculative_tokens=4) as srv:
        yield gens[0], openai_client(srv)


def test_usage_and_logprobs_stop_at_the_token_that_completed_the_stop_string(self_served):
    gen, client = self_served
    text = gen.generate(PROMPT, N, method="none").text
    stops = sorted({text[i:i + 2] for i in range(len(text) // 4, len(text) - 2, 3)
                    if text[i:i + 2].strip() and "\ufffd" not in text[i:i + 2]})
    assert stops
    for stop in stops:
        ref = gen.generate(PROMPT, N, method="none", stop=[stop])
        for method in ("draft", "auto"):
            kw = dict(model="self", prompt=PROMPT, max_tokens=N, temperature=0, stop=[stop], logprobs=1,
                      extra_body={"speculative": {"method": method}})
            resp = client.completions.create(**kw)
            assert resp.choices[0].text == ref.text and resp.choices[0].finish_reason == "stop"
            assert resp.usage.completion_tokens == len(ref.token_ids), (stop, method)
            assert len(resp.choices[0].logprobs.tokens) == len(ref.token_ids)
            chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
            assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
            assert chunks[-1].usage.completion_tokens == len(ref.token_ids)
            assert sum(len(c.choices[0].logprobs.tokens) for c in chunks
                       if c.choices and c.choices[0].logprobs) == len(ref.token_ids)
