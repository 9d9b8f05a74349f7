"""/metrics: Prometheus text that parses, with counters and histograms that move with requests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

FAMILIES = {
    "specrt_requests": "counter", "specrt_requests_cancelled": "counter", "specrt_request_finish": "counter",
    "specrt_prompt_tokens": "counter", "specrt_generation_tokens": "counter", "specrt_drafted_tokens": "counter",
    "specrt_accepted_tokens": "counter", "specrt_verify_steps": "counter", "specrt_acceptance_rate": "gauge",
    "specrt_mean_accepted_tokens": "gauge", "specrt_time_to_first_token_seconds": "histogram",
    "specrt_inter_token_latency_seconds": "histogram", "specrt_e2e_request_latency_seconds": "histogram",
    "specrt_queue_depth": "gauge", "specrt_running_requests": "gauge", "specrt_slots": "gauge",
    "specrt_speculation_enabled": "gauge",
}


def scrape(server) -> dict[str, float]:
    resp = httpx.get(f"{server.url}/metrics", timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    for name, kind in FAMILIES.items():
        assert families[name].type == kind, name
    out = {}
    for family in families.values():
        for s in family.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" not in s.labels:
                out[key] = s.value
    return out


def test_metrics_move(server, client, pair_generator):
    before = scrape(server)
    assert before["specrt_slots"] == 2
    ref = pair_generator.generate("import os", 10, temperature=0, method="draft", num_speculative_tokens=3)
    resp = client.completions.create(model="tiny", prompt="import os", max_tokens=10, temperature=0,
                                     extra_body={"speculative": {"method": "draft"}})  # as `ref`
    list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                        temperature=0, stream=True))
    httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 0}, timeout=10)
    after = scrape(server)

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("specrt_requests_total,endpoint=/v1/completions,status=200") == 1
    assert delta("specrt_requests_total,endpoint=/v1/chat/completions,status=200") == 1
    assert delta("specrt_requests_total,endpoint=/v1/completions,status=400") == 1
    assert delta("specrt_requests_total,endpoint=/metrics,status=200") == 1  # the first scrape
    assert delta("specrt_generation_tokens_total") == resp.usage.completion_tokens + 6
    assert delta("specrt_prompt_tokens_total") > resp.usage.prompt_tokens
    assert delta("specrt_drafted_tokens_total") >= ref.stats.drafted_tokens > 0
    assert delta("specrt_verify_steps_total") > 0
    assert delta("specrt_time_to_first_token_seconds_count") == 2
    assert delta("specrt_e2e_request_latency_seconds_count") == 2
    assert delta("specrt_inter_token_latency_seconds_count") == resp.usage.completion_tokens - 1 + 5
    assert delta("specrt_request_finish_total,finish_reason=length") == 2
    assert 0 <= after["specrt_acceptance_rate"] <= 1 and after["specrt_mean_accepted_tokens"] >= 1
    assert after["specrt_speculation_enabled"] == 1
    assert after["specrt_queue_depth"] == 0 and after["specrt_running_requests"] == 0

    client.completions.create(model="tiny", prompt="x", max_tokens=6, extra_body={"speculative": {"method": "none"}})
    assert scrape(server)["specrt_speculation_enabled"] == 0
