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
