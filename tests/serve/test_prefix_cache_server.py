"""The prefix cache behind a running server: a multi-turn chat through the official `openai` client reuses the first
turn's prompt rows on the second turn (usage.prompt_tokens_details.cached_tokens) and answers exactly as a server
without the cache; /metrics reports vLLM's prefix_cache counters (tokens), the hit rate and the bytes held."""

from __future__ import annotations

from serve_helpers import metric, openai_client, serving

SYSTEM = "Be brief and careful."  # the toy bundle's context is 128 tokens
TURNS = ["What does a step do?", "Why?"]


def _chat(server, cache_on: bool) -> list:
    client = openai_client(server, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
        out.append(r)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return out


def test_multi_turn_chat_reuses_the_history_and_answers_as_without_the_cache(pair_bundle):
    with serving(str(pair_bundle), max_batch=2, method="ngram", served_model_name="tiny", backend="ort",
                 prefix_cache_mb=0) as server:
        cold = _chat(server, cache_on=False)
        assert metric(server, "specrt_prefix_cache_budget_bytes") == 0
        assert metric(server, "vllm:prefix_cache_hits_total") == 0
    with serving(str(pair_bundle), max_batch=2, method="ngram", served_model_name="tiny", backend="ort") as server:
        assert metric(server, "specrt_prefix_cache_budget_bytes") == 256 * (1 << 20)
        warm = _chat(server, cache_on=True)
        queries = metric(server, "vllm:prefix_cache_queries_total")
        hits = metric(server, "vllm:prefix_cache_hits_total")
        assert queries == sum(r.usage.prompt_tokens for r in warm)
        assert hits == warm[1].usage.prompt_tokens_details.cached_tokens > 0
        assert metric(server, "specrt_prefix_cache_hit_rate") == hits / queries
        assert metric(server, "specrt_prefix_cache_bytes") > 0
    assert [r.choices[0].message.content for r in warm] == [r.choices[0].message.content for r in cold]
    assert warm[0].usage.prompt_tokens_details.cached_tokens == 0
    assert all(r.usage.prompt_tokens_details.cached_tokens == 0 for r in cold)
    # the second turn's history (system, first question and answer) came from the cache: all but its last block
    assert warm[1].usage.prompt_tokens_details.cached_tokens >= warm[0].usage.prompt_tokens - 16


def test_several_choices_report_the_cached_tokens_of_each_prompt_once(pair_bundle):
    # before: a request answered per choice (n > 1, several prompts, tools) had no usage.prompt_tokens_details,
    # although the prefix cache served its prompts (docs/serving.md lists it in every usage)
    import httpx

    a, b = list(range(5, 45)), list(range(50, 90))  # 40 tokens each: two full blocks of 16 to reuse
    with serving(str(pair_bundle), max_batch=4, method="none", served_model_name="tiny", backend="ort") as server:
        def post(body):
            r = httpx.post(f"{server.url}/v1/completions", timeout=120,
                           json={"model": "tiny", "max_tokens": 3, "temperature": 0, **body})
            assert r.status_code == 200, r.text
            return r.json()["usage"]

        for p in (a, b):  # the prompts' rows kept
            assert post({"prompt": p})["prompt_tokens_details"] == {"cached_tokens": 0}
        alone = post({"prompt": a})["prompt_tokens_details"]["cached_tokens"]
        assert alone == 32
        assert post({"prompt": a, "n": 3}) == {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49,
                                               "prompt_tokens_details": {"cached_tokens": 32}}
        sampled = post({"prompt": [a, b], "n": 2, "temperature": 1.0, "seed": 7})
        assert sampled["prompt_tokens"] == 80 and sampled["prompt_tokens_details"] == {"cached_tokens": 64}
        import json

        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120, json={
                "model": "tiny", "prompt": [a, b], "max_tokens": 3, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}
