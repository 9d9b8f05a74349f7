"""Prometheus metrics of one server (one CollectorRegistry per app, so apps in one process never mix).

| metric | type | meaning |
|---|---|---|
| specrt_requests_total{endpoint,status} | counter | HTTP requests by path and status code |
| specrt_requests_cancelled_total{endpoint} | counter | generations stopped because the client left |
| specrt_request_finish_total{finish_reason} | counter | finished generations: stop, length, cancelled, error |
| specrt_prompt_tokens_total | counter | prompt tokens of generations that ran |
| specrt_generation_tokens_total | counter | tokens generated |
| specrt_drafted_tokens_total, specrt_accepted_tokens_total | counter | draft tokens proposed / accepted |
| specrt_verify_steps_total | counter | target verification passes after prefill |
| specrt_acceptance_rate | gauge | accepted / drafted since start |
| specrt_mean_accepted_tokens | gauge | 1 + accepted / verify steps since start (counts the bonus token) |
| specrt_time_to_first_token_seconds | histogram | request arrival -> first token (queue time included) |
| specrt_inter_token_latency_seconds | histogram | time per token after the first (a step's gap / its tokens) |
| specrt_e2e_request_latency_seconds | histogram | request arrival -> last token |
| specrt_queue_depth | gauge | requests waiting for a slot |
| specrt_running_requests | gauge | busy slots |
| specrt_slots | gauge | slots (--max-concurrency) |
| specrt_speculation_enabled | gauge | 1 if the last finished request still speculated at its end, else 0 |

`specrt_speculation_enabled` looks at the k of the request's final steps: the loop lowers k near
max_tokens (down to 0 at the very last step), so "final k" means the last k not shortened that way,
approximated as "some k > 0 among the last max_draft_tokens + 1 steps".
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


def speculating(stats: Any, window: int) -> bool:
    """Whether a finished generation drafted (k > 0) in its last `window` steps (k clamping ignored)."""
    return any(k > 0 for k in stats.k_history[-window:])


class ServerMetrics:
    def __init__(self, pool: Any, max_draft_tokens: int = 8) -> None:
        self.window = max_draft_tokens + 1
        self.pool = pool
        self.registry = r = CollectorRegistry()
        self.requests = Counter("specrt_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.cancelled = Counter("specrt_requests_cancelled", "Generations stopped because the client left",
                                 ["endpoint"], registry=r)
        self.finished = Counter("specrt_request_finish", "Finished generations by finish reason",
                                ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("specrt_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter("specrt_generation_tokens", "Generated tokens", registry=r)
        self.drafted = Counter("specrt_drafted_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("specrt_accepted_tokens", "Draft tokens accepted", registry=r)
        self.verify_steps = Counter("specrt_verify_steps", "Target verification passes", registry=r)
        self.acceptance_rate = Gauge("specrt_acceptance_rate", "Accepted / drafted tokens since start", registry=r)
        self.mean_accepted = Gauge("specrt_mean_accepted_tokens",
                                   "1 + accepted / verify steps since start (includes the bonus token)", registry=r)
        self.ttft = Histogram("specrt_time_to_first_token_seconds", "Request arrival to first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("specrt_inter_token_latency_seconds", "Time per output token after the first",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("specrt_e2e_request_latency_seconds", "Request arrival to last token",
                             buckets=E2E_BUCKETS, registry=r)
        Gauge("specrt_queue_depth", "Requests waiting for a slot", registry=r).set_function(lambda: pool.waiting)
        Gauge("specrt_running_requests", "Busy slots", registry=r).set_function(lambda: pool.busy)
        Gauge("specrt_slots", "Generation slots", registry=r).set_function(lambda: pool.size)
        self.speculation = Gauge("specrt_speculation_enabled", "Whether the last request's final k was > 0",
                                 registry=r)
        self._totals = [0, 0, 0]  # drafted, accepted, verify steps

    def observe_step(self, gap_s: float, tokens: int) -> None:
        """A decoding step after the first token: `tokens` arrived `gap_s` after the previous step."""
        for _ in range(tokens):
            self.itl.observe(gap_s / tokens)

    def observe_done(self, finish_reason: str, prompt_tokens: int, completion_tokens: int, stats: Any) -> None:
        self.finished.labels(finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        if stats is None:
            return
        self.drafted.inc(stats.drafted_tokens)
        self.accepted.inc(stats.accepted_tokens)
        self.verify_steps.inc(stats.verify_steps)
        t = self._totals
        t[0] += stats.drafted_tokens
        t[1] += stats.accepted_tokens
        t[2] += stats.verify_steps
        self.acceptance_rate.set(t[1] / t[0] if t[0] else 0.0)
        self.mean_accepted.set(1.0 + t[1] / t[2] if t[2] else 0.0)
        self.speculation.set(1 if speculating(stats, self.window) else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
