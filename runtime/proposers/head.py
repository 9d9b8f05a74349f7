"""Draft-head proposer: an EAGLE-style head (specrt/models/draft_head.py) drafts on the target's hidden states.

Head row t reads the target's feature f_t (its final hidden state at position t) and the embedding of token
t + 1, and guesses token t + 2 plus the feature f_{t+1}, which the next draft row reads in place of the
target's. Its KV cache holds one row per committed position whose target feature it has seen:

* `start`: the prefill's last chunk of features (positions n-1-S .. n-2) is queued (a longer prompt's earlier
  chunks are not seen by the head: its cache starts at the chunk; the target still verifies everything);
* `propose`: the head first runs over the queued features (one multi-row call, the last row guesses d_1),
  then k - 1 one-row calls on its own features;
* `observe`: its draft rows are dropped (O(1): a length) and the verify pass's features of the newly
  committed positions are queued. Steps it did not draft (k = 0, hybrid's n-gram branch) only queue, at most the
  newest WINDOW rows (head_features.py: past that its cache restarts there, as on a long prompt).

Greedy drafts are argmaxes over the head's V' tokens (a point mass). Sampling drafts from the warped head
distribution, zero outside V' (mapped to full-vocabulary ids): the rejection rule stays exact.
"""

from __future__ import annotations

import time

import numpy as np

from specrt.runtime.backends.head import HeadRunner
from specrt.runtime.proposers.base import CallClock, Proposal
from specrt.runtime.proposers.head_features import FeatureQueue
from specrt.runtime.sampling import SamplingParams, sample, warp


class HeadProposer:
    name = "head"

    def __init__(self, runner: HeadRunner, params: SamplingParams, rng: np.random.Generator,
                 target_vocab: int) -> None:
        self.runner = runner
        self.params = params
        self.rng = rng
        self.vocab = target_vocab
        self.features = FeatureQueue()  # target features of committed positions not yet fed, bounded
        self._clock = CallClock()  # an ordinary head call (a few rows): see `propose`

    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        if target_hidden is None:
            raise ValueError("the head proposer needs the target's hidden states (want_hidden=True)")
        self.runner.truncate(0)
        self.features.start(target_hidden, n)

    def _pick(self, logits_row: np.ndarray, probs: np.ndarray | None, i: int) -> int:
        ids = self.runner.vocab_ids
        if self.params.greedy:
            return int(ids[int(logits_row.argmax())])
        p = warp(logits_row[None, :], self.params)[0]
        probs[i, ids] = p
        return int(ids[sample(p, self.rng)])

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        r = self.runner
        taken = self.features.take(r)  # the last proposal's draft rows dropped
        if taken is None:  # no feature to draft from (none handed over since): a plain step
            return Proposal.point_mass(np.empty(0, dtype=np.int64))
        feats, first = taken  # first: the position of the first queued feature
        rows = feats.shape[0]  # 1 + the tokens accepted at the last step, more after steps the head sat out
        t0 = time.perf_counter()
        logits, hidden = r(feats, tokens[first + 1:n], first)
        first_s = time.perf_counter() - t0
        draft = np.empty(k, dtype=np.int64)
        probs = None if self.params.greedy else np.zeros((k, self.vocab), dtype=np.float64)
        draft[0] = self._pick(logits[-1], probs, 0)
        h = hidden[-1:]
        for i in range(1, k):
            t0 = time.perf_counter()
            logits, hidden = r(h, draft[i - 1:i], n - 2 + i)
            self._clock.ordinary(time.perf_counter() - t0)
            draft[i] = self._pick(logits[-1], probs, i)
            h = hidden[-1:]
        # features queued while the head sat out steps (k = 0, hybrid's n-gram branch) are fed in this first call:
        # like a draft model's catch-up, that part is not a cost per drafted token (adaptive k would otherwise see
        # the head as dearer the longer it was off, and keep it off)
        catch_up_s = 0.0
        if rows > 2:
            catch_up_s = self._clock.beyond(first_s)
        else:
            self._clock.ordinary(first_s)
        if probs is None:
            return Proposal.point_mass(draft, calls=k, catch_up_s=catch_up_s)
        return Proposal.sampled(draft, probs, calls=k, catch_up_s=catch_up_s)

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None:
        self.features.add(n, target_hidden)  # the verify pass's rows now committed
