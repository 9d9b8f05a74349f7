"""`Scheduler`: continuous batching with per-request speculation, on one Generator's weights.

Requests join and leave at step boundaries. A step (`step()`):
1. admits the next waiting request when a slot is free (FCFS) and feeds one chunk (`prefill_chunk` tokens) of
   the one request in prefill, so a long prompt is interleaved with the running decodes instead of stalling them;
2. chooses k per decoding request from its acceptance estimate and the measured cost table (goodput.py; 0 allowed);
3. drafts for the requests with k > 0, then ONE batched pass over every decoding request's pending token
   (`RegionPool.decode_batch`); a request that drafted continues with one pass over its drafts in its own region
   (greedy: only when the batched row accepted d_1), then the acceptance rule of the single-sequence loop
   (`greedy_accept` / `rejection_sample` over the k + 1 rows), so each request advances by its own accepted count;
4. emits each request's new tokens and retires finished or cancelled requests (their slots are free at once).
A request whose prefill token already ends it (EOS, max_new_tokens=1) leaves at once, before the decode.

Region order: decoding requests hold target regions [0, d) in `running` order; the request in prefill holds region
d. A request's greedy output equals its output alone (tests/runtime/test_batching.py): same rows, same rule.
"""

from __future__ import annotations

import collections
import time

import numpy as np

from specrt.core.errors import BackendUnavailable, InvalidArgument
from specrt.runtime.acceptance import greedy_accept, rejection_sample
from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
from specrt.runtime.batch.goodput import CostTable, choose_ks
from specrt.runtime.batch.pool import RegionPool
from specrt.runtime.batch.sequence import Sequence
from specrt.runtime.loop import pick_token
from specrt.runtime.proposers.draft_model import DraftModelProposer
from specrt.runtime.proposers.ngram import NgramProposer
from specrt.runtime.sampling import warp

DEFAULT_PREFILL_CHUNK = 128
BATCH_METHODS = ("draft", "hybrid", "ngram", "none")


class Scheduler:
    def __init__(self, gen, max_batch: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        if not isinstance(gen.target, OrtFusedRunner):
            raise BackendUnavailable("continuous batching runs on the fused ONNX Runtime graph (backend 'ort', CPU); "
                                     f"this generator's target runs on {gen.backend!r}")
        self.gen, self.max_batch, self.prefill_chunk = gen, max_batch, prefill_chunk
        self.targets = RegionPool(gen.target, max_batch)
        self.drafts = RegionPool(gen.draft, max_batch) if isinstance(gen.draft, OrtFusedRunner) else None
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.prefilling: Sequence | None = None
        self.running: list[Sequence] = []
        self.costs = self._measure_costs()
        self.steps = 0
        self.step_tokens = 0  # tokens emitted by decode steps, and their seconds: goodput
        self.step_seconds = 0.0

    @property
    def methods(self) -> list[str]:
        return [m for m in self.gen.methods if m in BATCH_METHODS and (m in ("ngram", "none") or self.drafts)]

    # ---------------------------------------------------------------------------------- costs
    def _measure_costs(self) -> CostTable:
        """Seconds of a batched decode pass of b sequences (b = 1..max_batch; best of 3 after a warm-up) and of a
        single-sequence pass of s tokens (the generator's load-time verify timings)."""
        pool, batch = self.targets, []
        runners = [pool.acquire() for _ in range(self.max_batch)]
        ids = np.zeros(self.max_batch, np.int64)
        for b in range(1, self.max_batch + 1):
            best = float("inf")
            for rep in range(4):
                for r in runners[:b]:
                    r.truncate(0)
                t0 = time.perf_counter()
                pool.decode_batch(ids[:b])
                if rep:
                    best = min(best, time.perf_counter() - t0)
            batch.append(best)
        for r in reversed(runners):
            pool.release(r)
        if self.gen._load_costs is None:  # load(warmup=False)
            self.gen.warmup()
        verify, draft = self.gen._load_costs
        return CostTable(batch=batch, rows=list(verify), draft_token=draft or 0.0)

    # ----------------------------------------------------------------------------------- admit
    def add(self, seq: Sequence) -> None:
        if seq.method not in self.methods:
            raise InvalidArgument(f"method {seq.method!r} is not available with batching; choose one of "
                                  f"{', '.join(self.methods)}")
        self.waiting.append(seq)

    @property
    def active(self) -> int:
        return len(self.running) + (self.prefilling is not None)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def _admit(self) -> None:
        while self.prefilling is None and self.waiting and self.targets.used < self.max_batch:
            seq = self.waiting.popleft()
            if seq.cancel.is_set():
                self._finish(seq, "cancelled", release=False)
                continue
            gen = self.gen
            seq.tokens = np.empty(gen.max_seq_len, np.int64)
            seq.tokens[:seq.prompt_ids.size] = seq.prompt_ids
            seq.n = seq.prompt_ids.size
            seq.target = self.targets.acquire()
            seq.rng = seq.request.sampling.rng()
            seq.proposer = self._proposer(seq)
            self.prefilling = seq

    def _proposer(self, seq: Sequence):
        eos = self.gen.eos_ids
        if seq.method == "none" or seq.max_k == 0:
            return None
        if seq.method == "ngram":
            return NgramProposer(eos, **seq.request.ngram_sizes)
        seq.draft = self.drafts.acquire()
        draft = DraftModelProposer(seq.draft, seq.request.sampling, seq.rng, self.gen.vocab_size)
        if seq.method == "draft":
            return draft
        from specrt.runtime.proposers import hybrid

        sizes = {"min_n": hybrid.DEFAULT_MIN_N, "max_n": hybrid.DEFAULT_MAX_N, **seq.request.ngram_sizes}
        return hybrid.HybridProposer(NgramProposer(eos, **sizes), draft)

    # ------------------------------------------------------------------------------------ step
    def step(self) -> None:
        self._admit()
        if self.prefilling is not None:
            self._prefill_chunk(self.prefilling)
        if self.running:
            self._decode_step()
        self._retire()

    def _prefill_chunk(self, seq: Sequence) -> None:
        t0 = time.perf_counter()
        ids = seq.prompt_ids[seq.prefilled:seq.prefilled + self.prefill_chunk]
        last = seq.target.forward_last(ids)
        seq.prefilled += ids.size
        seq.stats.target_calls += 1
        seq.stats.prefill_seconds += time.perf_counter() - t0
        if seq.prefilled < seq.prompt_ids.size:
            return
        first = pick_token(last, seq.request.sampling, seq.rng)
        seq.tokens[seq.n] = first
        seq.n += 1
        if seq.proposer is not None and first not in self.gen.eos_ids:
            seq.proposer.start(seq.tokens, seq.n, None)
        seq.stats.new_tokens = 1
        self.prefilling = None
        self._emit(seq, [first])
        if seq.finished:  # its first token ended it (EOS, max_new_tokens=1): no decode step, as alone
            self._finish(seq, seq.finished)  # its region is the last one in use: nothing moves
            return
        self.running.append(seq)  # its region is d, the first after the running ones

    def _decode_step(self) -> None:
        t0 = time.perf_counter()
        seqs, cap = self.running, self.gen.max_seq_len
        max_ks = [0 if s.proposer is None or s.finished else
                  max(0, min(s.max_k, s.remaining - 1, cap - s.n - 1)) for s in seqs]
        greedy = [s.request.sampling.greedy for s in seqs]
        dcost = [self.costs.draft_token if s.draft is not None else 0.0 for s in seqs]
        ks = choose_ks([s.acceptance for s in seqs], max_ks, greedy, dcost, self.costs)
        proposals = [s.proposer.propose(s.tokens, s.n, k) if k > 0 else None for s, k in zip(seqs, ks)]
        pending = np.array([s.tokens[s.n - 1] for s in seqs], np.int64)
        rows0 = self.targets.decode_batch(pending).copy()  # [B, V]
        emitted_total = 0
        for s, k, prop, row0 in zip(seqs, ks, proposals, rows0):
            emitted_total += self._advance(s, k, prop, row0)
        self.steps += 1
        self.step_tokens += emitted_total
        self.step_seconds += time.perf_counter() - t0

    def _advance(self, s: Sequence, k: int, prop, row0: np.ndarray) -> int:
        """Accept / emit for one sequence after the batched pass (its target holds n positions now)."""
        params = s.request.sampling
        drafts = prop.token_ids if prop is not None else np.empty(0, np.int64)
        kk = drafts.size
        if prop is not None:
            s.stats.draft_calls += prop.calls
        if kk == 0:
            j, nxt = 0, pick_token(row0, params, s.rng)
        elif params.greedy and int(row0.argmax()) != int(drafts[0]):
            j, nxt = 0, int(row0.argmax())  # d_1 rejected by the batched row: no pass over the drafts
        else:
            rest = s.target.forward(drafts)  # [kk, V]
            s.stats.target_calls += 1
            logits = np.concatenate([row0[None], rest])  # [kk + 1, V]
            if params.greedy:
                j, nxt = greedy_accept(drafts, logits)
            else:
                q = warp(logits, params)
                p = prop.probs
                if p is not None and p.shape[1] > q.shape[1]:
                    q = np.pad(q, ((0, 0), (0, p.shape[1] - q.shape[1])))
                j, nxt = rejection_sample(drafts, p, q, s.rng)
        emitted = drafts[:j].tolist() + [int(nxt)]
        for i, t in enumerate(emitted):
            if t in self.gen.eos_ids:
                emitted = emitted[:i + 1]
                break
        s.tokens[s.n:s.n + len(emitted)] = emitted
        s.n += len(emitted)
        s.target.truncate(s.n - 1)
        s.stats.target_calls += 1
        s.stats.record_step(k, kk, j, getattr(prop, "source", "") if prop is not None else "")
        s.stats.num_speculative_tokens = k
        if s.proposer is not None:
            s.proposer.observe(s.n, j, None)
        if kk:
            s.observe_acceptance(kk, j)
        s.stats.new_tokens += len(emitted)
        self._emit(s, emitted)
        return len(emitted)

    def _emit(self, s: Sequence, ids: list[int]) -> None:
        s.stats.elapsed_s = time.perf_counter() - s.started
        if ids[-1] in self.gen.eos_ids:
            s.finished = "stop"
        elif s.remaining <= 0 or s.n >= self.gen.max_seq_len:
            s.finished = "length"
        s.stats.finish_reason = s.finished
        s.emit(ids, s)

    # ---------------------------------------------------------------------------------- retire
    def _retire(self) -> None:
        for s in list(self.running):
            if s.cancel.is_set() and not s.finished:
                s.finished = s.stats.finish_reason = "cancelled"
            if s.finished:
                self.running.remove(s)
                self._finish(s, s.finished)
        s = self.prefilling
        if s is not None and s.cancel.is_set():
            self.prefilling = None
            self._finish(s, "cancelled")
        for s in list(self.waiting):
            if s.cancel.is_set():
                self.waiting.remove(s)
                self._finish(s, "cancelled", release=False)

    def _finish(self, s: Sequence, reason: str, release: bool = True) -> None:
        if release:
            self.targets.release(s.target)
            if s.draft is not None:
                self.drafts.release(s.draft)
        s.target = s.draft = s.proposer = None
        s.finished = s.stats.finish_reason = reason
        s.emit([], s)  # the end: an empty chunk with the final stats
