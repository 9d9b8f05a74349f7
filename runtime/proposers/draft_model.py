"""Draft-model proposer: a small compiled model drafts k tokens autoregressively on its own runner.

Its KV cache follows the committed tokens lazily: each `propose` first feeds every committed token the
draft has not seen (normally one; two after a fully accepted step, which is the "catch-up" of d_k; the
whole prompt on the first call), then k - 1 single-token steps. After verification `observe` rolls the
draft cache back to the longest prefix that is still committed.
"""

from __future__ import annotations

import time

import numpy as np

from specrt.runtime.backends.base import Runner
from specrt.runtime.sampling import SamplingParams, sample, warp
from specrt.runtime.proposers.base import CallClock, Proposal


class DraftModelProposer:
    name = "draft"

    def __init__(self, runner: Runner, params: SamplingParams, rng: np.random.Generator,
                 target_vocab: int, prefill_chunk: int = 256, lazy: bool = False) -> None:
        """`lazy`: `start` does not prefill; the first `propose` feeds the prompt (a request that never drafts,
        e.g. in a batch where drafting does not pay, never pays for the draft's prefill)."""
        self.runner = runner
        self.lazy = lazy
        self.params = params
        self.rng = rng
        self.vocab = max(target_vocab, runner.vocab_size)  # draft probs padded to the larger vocabulary
        self.prefill_chunk = prefill_chunk
        self._tok = np.empty(1, dtype=np.int64)
        self._clock = CallClock()  # one single-token draft call, seconds (catch-up: Proposal.catch_up_s)
        self.logits_state = None  # a LogitsState (runtime/logits_processors.py): drafts see the request's penalties

    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        """Prefill the draft with the committed tokens except the pending last one (timed as prefill)."""
        self.runner.set_argmax_only(self.params.greedy and self.logits_state is None)  # greedy drafts are argmaxes (a screened head may skip rows)
        self.runner.reset()
        if not self.lazy:
            self.runner.prefill(tokens[:n - 1], self.prefill_chunk)

    def _pick(self, logits_row: np.ndarray, probs_out: np.ndarray | None, i: int, drafts: np.ndarray) -> int:
        if self.logits_state is not None:  # draft i sees the penalties with drafts[:i] counted, as the target will
            logits_row = self.logits_state.draft_row(logits_row, drafts[:i])
        if self.params.greedy:
            return int(logits_row.argmax())
        p = warp(logits_row[None, :], self.params)[0]
        probs_out[i, : p.size] = p
        return sample(p, self.rng)

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        r = self.runner
        draft = np.empty(k, dtype=np.int64)
        probs = None if self.params.greedy else np.zeros((k, self.vocab), dtype=np.float64)
        unseen = n - r.length  # normally 1 (the pending token), 2 after a fully accepted step
        calls = -(-unseen // self.prefill_chunk)
        t0 = time.perf_counter()
        draft[0] = self._pick(r.prefill(tokens[r.length:n], self.prefill_chunk), probs, 0, draft)
        first_s = time.perf_counter() - t0
        for i in range(1, k):
            t0 = time.perf_counter()
            self._tok[0] = draft[i - 1]
            logits = r.forward(self._tok)
            calls += 1
            draft[i] = self._pick(logits[-1], probs, i, draft)
            self._clock.ordinary(time.perf_counter() - t0)
        # a long catch-up (the draft sat out steps): its cost beyond one ordinary call is not a per-token cost
        catch_up_s = self._clock.beyond(first_s) if unseen > 2 else 0.0
        if probs is None:  # greedy drafts are argmaxes: a point mass
            return Proposal.point_mass(draft, calls, catch_up_s)
        return Proposal.sampled(draft, probs, calls, catch_up_s)

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None:
        # Valid cached prefix: everything still committed except the pending last token.
        self.runner.truncate(min(self.runner.length, n - 1))
