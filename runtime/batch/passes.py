"""Running a batched step's passes (plan.py) on the KV pool, and committing their outputs into the requests.

Every verified request goes through the single-sequence loop's acceptance rule and commit (runtime/step.py); a
batched one-token pass's row is the plain loop's next token. `run` returns what a pass gave, `update` commits it:
the scheduler calls them pass by pass, since the batched pass reads the pending tokens its own passes left.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from specrt.runtime.batch.failures import guarded
from specrt.runtime.batch.plan import BatchedTokenPass, Chunk, Decode, OwnPass, PrefillPass
from specrt.runtime.batch.protocol import KVPool, PassCall
from specrt.runtime.batch.sequence import BatchSequence
from specrt.runtime.step import accept, commit, keep_path, pick_token, record, verify


class Passes:
    def __init__(self, gen, pool: KVPool, prefill_done: Callable[[BatchSequence, np.ndarray], None]) -> None:
        """`gen`: the Generator (its end tokens and context); `pool`: the target's KV pool; `prefill_done(seq,
        last [V])`: the scheduler's, when a prompt is in."""
        self.gen, self.pool, self.prefill_done = gen, pool, prefill_done

    def run(self, p):
        """Execute one pass -> its outputs (logits rows; with the seconds of a prompt chunk's pass)."""
        if isinstance(p, OwnPass):  # the single-sequence verify (runtime/step.py), a tree's too; None: it failed
            return guarded(p.decode.seq, verify, p.decode.seq, p.decode.proposal.token_ids,
                           p.decode.proposal.parents)  # [k + 1, V]
        if isinstance(p, BatchedTokenPass):
            return self.pool.decode_batch(np.array([d.seq.tokens[d.seq.n - 1] for d in p.decodes], np.int64))
        t0 = time.perf_counter()
        if isinstance(p, PrefillPass):
            last = guarded(p.chunk.seq, p.chunk.seq.target.forward_last, p.chunk.ids)  # [V]
            return last, time.perf_counter() - t0
        calls, written = [], []  # written: (sequence, its cache length once the pass has run)
        for d in p.decodes:
            s = d.seq
            ids = np.concatenate([s.tokens[s.n - 1:s.n], d.proposal.token_ids])
            past = s.target.length
            s.target.cache.reserve(ids.size)  # the attention padding stays within the capacity (`PackedPass.run`)
            calls.append(PassCall(self.pool.region_of(s.target), ids, past, (0, ids.size), s.target.min_rows))
            written.append((s, past + ids.size))
        for c in p.chunks:
            past = c.seq.target.length
            c.seq.target.cache.reserve(c.ids.size)
            calls.append(PassCall(self.pool.region_of(c.seq.target), c.ids, past, (c.ids.size - 1, 1)))
            written.append((c.seq, past + c.ids.size))
        t0 = time.perf_counter()
        outs = self.pool.packed().run(calls)  # min_rows padding in attention only (`PackedPass.run`)
        seconds = time.perf_counter() - t0
        # Every call's rows are committed before any request may leave: one that ends at its first token frees its
        # region at once, and the regions above move down with their committed rows only (`RegionPool.release`).
        for seq, length in written:
            seq.target.cache.length = length
            seq.stats.target_calls += 1
        return outs, seconds

    def update(self, p, out) -> int:
        """Commit one pass's outputs: the acceptance rule and commit of each request it verified, the prompt chunks'
        progress. Returns the decode tokens emitted."""
        if isinstance(p, OwnPass):
            return guarded(p.decode.seq, self._accept, p.decode, out, default=0)
        if isinstance(p, BatchedTokenPass):
            return self._batched_token(p.decodes, out)
        if isinstance(p, PrefillPass):
            guarded(p.chunk.seq, self._prefilled, p.chunk, out[0], out[1])
            return 0
        outs, seconds = out
        for d, logits in zip(p.decodes, outs):  # every verified row refreshes a successor table, as alone
            guarded(d.seq, _observe_verify, d.seq, d.proposal.token_ids, logits)
        emitted = sum(guarded(d.seq, self._accept, d, logits, default=0) for d, logits in zip(p.decodes, outs))
        for c, logits in zip(p.chunks, outs[len(p.decodes):]):
            guarded(c.seq, self._prefilled, c, logits[0], seconds, True)
        return emitted

    def _accept(self, d: Decode, logits: np.ndarray) -> int:
        """The loop's acceptance rule over the logits of the request's pending token and drafts ([k + 1, V])."""
        s, kk = d.seq, d.proposal.token_ids.size
        verdict = accept(d.proposal, logits, s.request.sampling, s.rng)
        if d.proposal.parents is not None:  # a tree: the accepted path's KV rows moved into place in the region
            keep_path(s.target, s.n - 1, verdict.path, None)
            s.stats.tree_passes += 1
        if kk == 0 and d.free is not None and d.free.token_ids.size:  # the free draft judged against the token
            s.observe_acceptance(1, int(int(d.free.token_ids[0]) == verdict.token))
        record(s.stats, d.k, d.proposal, verdict)
        if kk and d.proposal.parents is None:  # (a tree request is sized on its proposer's estimates: trees.py)
            s.observe_acceptance(kk, verdict.count)
        _policy_update(s, d.k, kk, verdict.count)
        return self._commit(s, verdict.emitted(d.proposal), verdict.count)

    def _batched_token(self, decodes: list[Decode], rows: np.ndarray) -> int:
        """Each unfinished request gets one more token from its row of the batched pass ([B, V])."""
        emitted = 0
        for d, row in zip(decodes, rows):
            if d.seq.finished:  # ended (or failed) by its own pass this step: its row is discarded (region released)
                continue
            emitted += guarded(d.seq, self._one_token, d, row, default=0)
        return emitted

    def _one_token(self, d: Decode, row: np.ndarray) -> int:
        s = d.seq
        if d.k and s.policy is not None:  # seeded, its step done by its own pass: a token more would draw a random
            s.target.truncate(s.n - 1)  # number its run alone does not; the row is discarded
            return 0
        s.stats.target_calls += 1
        _observe_verify(s, s.tokens[:0], row[None])
        nxt = pick_token(row, s.request.sampling, s.rng)
        if d.k == 0:
            s.stats.record_step(0, 0, 0, "")
            _policy_update(s, 0, 0, 0)
            if d.free is not None and d.free.token_ids.size:  # the free n-gram draft judged against the token
                s.observe_acceptance(1, int(int(d.free.token_ids[0]) == nxt))
        return self._commit(s, [nxt], 0)

    def _commit(self, s: BatchSequence, emitted: list[int], accepted: int) -> int:
        emitted = commit(s, emitted, accepted, s.stop_ids)  # cut at EOS / a stop id, truncate, the proposer observes
        self.emit(s, emitted)
        return len(emitted)

    def emit(self, s: BatchSequence, ids: list[int]) -> None:
        s.stats.elapsed_s = time.perf_counter() - s.started
        if ids[-1] in s.stop_ids:
            s.finished = "stop"
        elif s.remaining <= 0 or s.n >= self.gen.max_seq_len:
            s.finished = "length"
        s.stats.finish_reason = s.finished
        s.emit(ids, s)

    def _prefilled(self, c: Chunk, last: np.ndarray, seconds: float, counted: bool = False) -> None:
        """A prompt chunk ran (`last` [V]: its last row's logits); `counted`: its target call already was."""
        seq = c.seq
        seq.prefilled += c.ids.size
        if not counted:
            seq.stats.target_calls += 1
        seq.stats.prefill_seconds += seconds
        if seq.prefilled == seq.prompt_ids.size:
            self.prefill_done(seq, last)

def _observe_verify(s: BatchSequence, drafts: np.ndarray, logits: np.ndarray) -> None:
    """A proposer that learns from verified rows (Token Recycling's table) sees the pending token and `drafts` [k]
    with their rows [k + 1, V] (an own pass's are seen by runtime/step.py's `verify`)."""
    observe = getattr(s.proposer, "observe_verify", None)
    if observe is not None:
        observe(np.concatenate([s.tokens[s.n - 1:s.n], drafts]), logits, None)


def _policy_update(s: BatchSequence, k: int, drafted: int, accepted: int) -> None:
    """A seeded request's step is over: its policy learns from the counts (never timings: CountOnlyAdaptiveK)."""
    if s.policy is not None:
        s.policy.update(k, drafted, accepted, 0.0, 0.0)
        s.forced_k = None
