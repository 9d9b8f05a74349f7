"""Prefix caching: a request whose prompt starts with rows computed for an earlier prompt copies them and prefills
only the rest (docs/batching.md, "Prefix cache"). The generalisation across time of PromptSharing (shared_prompt.py),
with the same hooks in the scheduler: `on_admit`, `on_chunk`, `on_prefilled`, `on_finish`.

Exactness (measured: scripts/prefix_rows.py, SmolLM2 fp32 and int4): a KV row written by a prefill chunk of two
rows or more is bit-identical whatever the chunking (256+256+88, 300+300, 6x100, 496+104, 38x16 all equal one
600-row pass), and so is a row of a several-row verify pass; a row written by a ONE-row pass (a one-token decode
step, a one-row prefill chunk) differs in fp32 (~2e-5). So the store keeps prompt rows, only up to the first
one-row chunk inside the prompt (a shared prefill budget can cut one: `on_chunk`), and answers' rows only where no
call has one row (`min_rows` > 1: int4 at accuracy level 4, whose two-row decode rows equal prefill rows: `on_finish`).
A hit takes a multiple of the block size, leaves at least one row to prefill, and leaves a suffix whose last chunk is
one row exactly when the prompt's own last chunk would be (`reusable_length`): the rows a hit prefills are then the
rows the request computes without the cache.

Fused CPU pools (`RegionPool`) only: batch runners (SlotPool) have no row copy between slots. The draft model's
rows are not cached (a draft model catches up lazily, on the request's first drafting step, after its first token).
"""

from __future__ import annotations

import numpy as np

from specrt.runtime.batch.pool import RegionPool
from specrt.runtime.prefix_budget import DEFAULT_PREFIX_CACHE_MB, MB, check_budget_mb  # noqa: F401
from specrt.runtime.batch.prefix_store import DEFAULT_BLOCK, PrefixStore
from specrt.runtime.batch.sequence import BatchSequence


def reusable_length(prompt_len: int, cached: int, block: int, chunk: int) -> int:
    """The most prompt rows a request takes from the store: a multiple of `block`, at most `cached`, at least one
    prompt row left to prefill (its logits pick the first token), and such that the suffix, cut in `chunk`-token
    steps from there, ends with a one-row chunk exactly when the whole prompt cut from row 0 does (a one-row pass
    computes its row differently: the hit must compute the last row as the request alone without the cache)."""
    h = min(cached, prompt_len - 1) // block * block
    one_row = prompt_len % chunk == 1
    while h > 0 and ((prompt_len - h) % chunk == 1) != one_row:
        h -= block
    return max(h, 0)


class PrefixCaching:
    def __init__(self, pool, budget_mb: float, prefill_chunk: int, block: int = DEFAULT_BLOCK) -> None:
        budget_mb = check_budget_mb(budget_mb)
        self.pool, self.chunk = pool, prefill_chunk
        self.enabled = budget_mb > 0 and isinstance(pool, RegionPool)
        self.store = PrefixStore(int(budget_mb * MB) if self.enabled else 0, block)
        self.block = block
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries counts tokens)
        self.hits = 0  # prompt tokens whose rows came from the store, not prefilled (vLLM's prefix_cache_hits)
        if self.enabled:
            c = pool.config
            self.block_bytes = 2 * c.num_layers * c.num_kv_heads * block * c.head_dim * 4
        # answers' rows are stored only where no call has one row (one-row passes compute rows differently in fp32)
        self.answers = self.enabled and pool.runners[0].min_rows > 1

    def on_admit(self, seq: BatchSequence) -> None:
        """`seq` has its empty region (and no donor of the batch: PromptSharing runs first): copy the longest
        reusable stored prefix into it; the scheduler prefills from there."""
        if not self.enabled:
            return
        if seq.donor is not None or seq.shared_last is not None:  # the donor's rows: never captured again
            seq.exact_rows = 0
            return
        n = seq.prompt_ids.size
        self.queries += n
        keys = self.store.match(seq.prompt_ids)
        h = reusable_length(n, len(keys) * self.block, self.block, self.chunk)
        if h == 0:
            return
        b, bufs = self.pool.region_of(seq.target), self.pool.keys + self.pool.values
        for j, rows in enumerate(self.store.rows(keys[:h // self.block])):  # rows [2L, Hkv, block, D]
            s = slice(j * self.block, (j + 1) * self.block)
            for i, buf in enumerate(bufs):
                buf[b, :, s] = rows[i]
        seq.target.cache.length = seq.prefilled = seq.cached_tokens = seq.stats.cached_tokens = h
        self.hits += h

    def on_chunk(self, seq: BatchSequence, size: int) -> None:
        """A prefill chunk of `size` rows from row seq.prefilled is about to run: a one-row chunk before the
        prompt's last row (a prefill budget shared by several prompts) ends the rows the store may keep."""
        if size == 1 and seq.prefilled + 1 < seq.prompt_ids.size and seq.exact_rows is None:
            seq.exact_rows = seq.prefilled

    def on_prefilled(self, seq: BatchSequence) -> None:
        """`seq`'s prompt rows are in its region: store its full blocks (up to its exact rows) not stored yet."""
        if self.enabled:
            self._capture(seq, seq.prompt_ids, seq.prompt_ids.size if seq.exact_rows is None else seq.exact_rows)

    def on_finish(self, seq: BatchSequence, reason: str) -> None:
        """`seq` ends, its region not yet released: on a target whose every call has two rows or more (`min_rows`,
        int4 at accuracy level 4) its answer's rows are a prefill's rows too (measured), so the committed rows
        (prompt and answer but the last token) are stored: a chat's next turn reuses the answer as well."""
        if not (self.enabled and self.answers and reason in ("stop", "length") and seq.target is not None
                and seq.exact_rows is None and seq.tokens is not None):
            return
        self._capture(seq, seq.tokens[:seq.target.length], seq.target.length)

    def _capture(self, seq: BatchSequence, ids: np.ndarray, limit: int) -> None:
        keys = self.store.chain(ids, min(limit // self.block, self.store.budget_bytes // self.block_bytes))
        if not keys:
            return
        self.store.touch(keys)  # the stored head of the chain is not evicted by its own tail's insertion
        b, bufs = self.pool.region_of(seq.target), self.pool.keys + self.pool.values
        for j, key in enumerate(keys):
            if key in self.store:
                continue
            s = slice(j * self.block, (j + 1) * self.block)
            if not self.store.put(key, np.stack([buf[b, :, s] for buf in bufs])):  # a copy: [2L, Hkv, block, D]
                break
        self.store.touch(keys)

    def describe(self) -> dict:
        """The numbers /metrics reports (specrt/serve/batching.py) and scripts/prefix_bench.py prints."""
        return {"enabled": self.enabled, "block": self.block, "queries": self.queries, "hits": self.hits,
                "used_bytes": self.store.used_bytes, "budget_bytes": self.store.budget_bytes,
                "blocks": len(self.store), "evicted": self.store.evicted}
