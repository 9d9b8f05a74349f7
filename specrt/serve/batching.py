"""`specrt serve --max-batch N`: one Generator (one weights copy) behind a `BatchEngine`, N slots that batch.

The N slots of the server's one admission queue (slots.py: bounded, 429 when full) are the batch's rows: a request
that has one is queued on the engine, which admits it at once, and reads its output from a per-request async stream
that the engine's thread feeds (engine_stream.py); no thread per slot.

Metrics added to /metrics (vLLM's names where it has one for the same thing, beside specrt's):
| metric | meaning |
|---|---|
| specrt_batch_size, vllm:num_requests_running | sequences in the batch now (decoding + the one in prefill) |
| vllm:num_requests_waiting | requests waiting to run: those in the admission queue (specrt_queue_depth) |
| specrt_batch_max | --max-batch |
| specrt_goodput_tokens_per_second | tokens emitted by decode steps / their seconds, since start |
| specrt_request_acceptance_rate | histogram of each finished request's accepted / drafted tokens |
| specrt_kv_bytes_per_slot | KV memory of one slot (target + draft), preallocated |
| specrt_shared_prompt_tokens | prompt tokens copied from a sequence of the batch with the same prompt, not prefilled |
| vllm:prefix_cache_queries_total | prompt tokens looked up in the prefix cache (counter, tokens, as vLLM) |
| vllm:prefix_cache_hits_total | prompt tokens whose KV rows came from the prefix cache, not prefilled (counter) |
| specrt_prefix_cache_hit_rate | hits / queries since start |
| specrt_prefix_cache_bytes, specrt_prefix_cache_budget_bytes | KV bytes the prefix cache holds / may hold |
| specrt_prefix_cache_evicted_blocks_total | blocks evicted (least recently used first) to stay within the budget |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from prometheus_client import Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


# the sizes: runtime/batch/memory.py (auto, and the check of an explicit size against the memory available)
from specrt.runtime.batch.memory import AUTO_MAX, AUTO_SLOTS_PER_CORE, auto_max_batch, kv_bytes_per_slot  # noqa: F401


def batched_engine(bundle: Union[str, Path, Any], max_batch: Union[int, str], backend: str = "auto",
                   threads: Optional[int] = None, prefix_cache_mb: Optional[float] = None) -> tuple[Any, Any]:
    """(the generator, its engine) on one loaded generator (`bundle`: a path, or a loaded Generator).
    max_batch "auto": `auto_max_batch`; when that is 0, (the generator, None): one slot, no engine (and no prefix
    cache). `prefix_cache_mb`: the engine's prefix cache budget (None: the default; 0: off)."""
    from specrt.core.errors import InvalidArgument
    from specrt.runtime import load
    from specrt.runtime.batch.engine import BatchEngine

    from specrt.runtime.prefix_budget import DEFAULT_PREFIX_CACHE_MB, check_budget_mb

    if max_batch != "auto" and (not isinstance(max_batch, int) or max_batch < 1):
        raise InvalidArgument(f"max_batch must be >= 1 or 'auto', got {max_batch!r}")
    prefix_cache_mb = check_budget_mb(DEFAULT_PREFIX_CACHE_MB if prefix_cache_mb is None else prefix_cache_mb)
    if isinstance(bundle, (str, Path)):
        if backend in ("auto", "ort") and max_batch != 1:
            from specrt.runtime.backends.ort.threads import share_thread_pool

            share_thread_pool(threads)  # the engine's fused and packed sessions on one pool (threads.py)
        gen = load(bundle, backend=backend, threads=threads)
    else:
        gen = bundle
    if max_batch == "auto":
        max_batch = auto_max_batch(gen)
        if max_batch == 0:
            return gen, None
    return gen, BatchEngine(gen, max_batch=max_batch, prefix_cache_mb=prefix_cache_mb)


def add_batch_metrics(metrics: Any, engine: Any) -> None:
    r, sched = metrics.registry, engine.scheduler
    Gauge("specrt_batch_size", "Sequences in the batch", registry=r).set_function(lambda: sched.active)
    Gauge("vllm:num_requests_running", "Sequences in the batch", registry=r).set_function(lambda: sched.active)
    pool = metrics.pool  # as vLLM's: every request not yet running; the admission queue is the only one
    Gauge("vllm:num_requests_waiting", "Requests waiting to run", registry=r).set_function(lambda: pool.waiting)
    Gauge("specrt_batch_max", "Batch slots (--max-batch)", registry=r).set(sched.max_batch)
    Gauge("specrt_packed_pass", "1 when several sequences' passes run as one packed pass (SPECRT_PACKED)",
          registry=r).set(int(sched.packed))
    Gauge("specrt_goodput_tokens_per_second", "Decode-step tokens per second since start", registry=r).set_function(
        lambda: sched.step_tokens / sched.step_seconds if sched.step_seconds else 0.0)
    Gauge("specrt_shared_prompt_tokens", "Prompt tokens copied from a sequence with the same prompt instead of "
          "prefilled (n > 1, identical prompts), since start", registry=r).set_function(lambda: sched.sharing.tokens)
    kv = sched.targets.kv_bytes_per_slot() + (sched.drafts.kv_bytes_per_slot() if sched.drafts else 0)
    Gauge("specrt_kv_bytes_per_slot", "KV cache bytes per slot (target + draft)", registry=r).set(kv)
    metrics.registry.register(_PrefixCacheMetrics(sched.prefix))
    acceptance = Histogram("specrt_request_acceptance_rate", "Accepted / drafted tokens per finished request",
                           buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r)
    observe_done = metrics.observe_done

    def observe(finish_reason, prompt_tokens, completion_tokens, stats):
        observe_done(finish_reason, prompt_tokens, completion_tokens, stats)
        if stats is not None and stats.drafted_tokens:
            acceptance.observe(stats.accepted_tokens / stats.drafted_tokens)

    metrics.observe_done = observe


class _PrefixCacheMetrics:
    """The prefix cache's counters, read at each scrape from the scheduler's `PrefixCaching` (its thread writes
    them: ints, read whole)."""

    def __init__(self, prefix) -> None:
        self.prefix = prefix

    def collect(self):
        d = self.prefix.describe()
        yield CounterMetricFamily("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                  value=d["queries"])
        yield CounterMetricFamily("vllm:prefix_cache_hits", "Prompt tokens whose KV rows came from the prefix cache",
                                  value=d["hits"])
        yield GaugeMetricFamily("specrt_prefix_cache_hit_rate", "Prefix cache hits / queries (tokens) since start",
                                value=d["hits"] / d["queries"] if d["queries"] else 0.0)
        yield GaugeMetricFamily("specrt_prefix_cache_bytes", "KV bytes held by the prefix cache", value=d["used_bytes"])
        yield GaugeMetricFamily("specrt_prefix_cache_budget_bytes", "Prefix cache budget in bytes (0: off)",
                                value=d["budget_bytes"])
        yield CounterMetricFamily("specrt_prefix_cache_evicted_blocks", "Prefix cache blocks evicted (LRU)",
                                  value=d["evicted"])
