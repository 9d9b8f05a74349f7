"""A draft head (plain or fused) as one source of `auto`'s tree (auto.py): its greedy chain, plus its 2nd and 3rd
choices where it is unsure, drafted only as deep as the sizing says its cost pays (as a draft model, draft_source.py).

    src = HeadSource(runner)                          # the bundle's head runner (runtime/backends/head.py)
    src.start(tokens, n, target_hidden)               # the prefill's features queued, nothing run yet
    d = src.depth(stats, n, parents, keys, costs, k, overhead_s, chain_only)   # 0: not worth a call
    calls = src.extend(trie, keys, tokens, n, d)      # d head calls; nodes keyed ("head", depth, rank)
    src.observe(n, target_hidden)                     # the committed rows' features queued

The head's bookkeeping is the `head` method's (proposers/head.py): its cache holds one row per committed position
whose target feature it has read; the features of positions committed since its last call are queued and fed in
its next call (so steps where it is not drafted cost a copy, no head call; at most the newest WINDOW rows are kept,
head_features.py); draft rows read its own fed-back feature (a fused head: zero layers, as in training). A weak
head's nodes stop being accepted, their running estimates fall, and `depth` stops drafting it: it then costs
nothing.
"""

from __future__ import annotations

import time

import numpy as np

from specrt.runtime.proposers.draft_source import DraftSource, add_choices
from specrt.runtime.proposers.head_features import FeatureQueue


class HeadSource(DraftSource):
    SOURCE = "head"

    def __init__(self, runner, fixed: bool = False, cost_s: float = 0.0) -> None:
        super().__init__(runner, 0, fixed=fixed, cost_s=cost_s)
        self.features = FeatureQueue()  # target features of committed positions not yet fed, bounded

    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        if target_hidden is None:
            raise ValueError("the head source needs the target's hidden states (want_hidden=True)")
        self._tokens = tokens
        self.runner.truncate(0)
        self.features.start(target_hidden, n)

    def _unseen(self, n: int) -> int:
        return self.features.queued

    def depth(self, *args) -> int:
        return super().depth(*args) if self.features.queued else 0  # no feature to draft from: no call

    def extend(self, trie, keys, tokens: np.ndarray, n: int, d: int) -> int:
        """Run the head d calls deep from tokens[:n] (the first call feeds the queued features) and add its chain
        (and runners-up where unsure) to `trie`; returns the head calls made."""
        r = self.runner
        t0 = time.perf_counter()
        taken = self.features.take(r)  # the last step's draft rows dropped
        if taken is None:
            return 0
        feats, first = taken
        logits, hidden = r(feats, tokens[first + 1:n], first)
        calls, parent = 1, -1
        for depth in range(1, d + 1):
            main, top = add_choices(trie, keys, parent, logits[-1], self.SOURCE, depth, r.vocab_ids)
            if main is None or depth == d:
                break
            logits, hidden = r(hidden[-1:], np.array([top], dtype=np.int64), n - 2 + depth)
            calls += 1
            parent = main
        self._timed(t0, calls)
        return calls

    def observe(self, n: int, target_hidden: np.ndarray | None = None) -> None:
        """tokens[:n] committed: the verify pass's rows of the newly committed positions are queued (bounded:
        head_features.py)."""
        self.features.add(n, target_hidden)


def head_source(gen, seeded: bool) -> HeadSource | None:
    """The head source of `gen` (a Generator) for `auto`, None without a head (or where its runner cannot run: a
    fused head on a backend that does not hand it the target's layers). Its first cost per call: the head's streamed
    weight bytes over the target's times the load-time one-row pass (policy.py); then its measured calls."""
    m = gen.manifest
    if m.draft_head is None:
        return None
    layers = m.draft_head.feature_layers
    if layers and gen.target.hidden_layers != len(layers):
        return None
    from specrt.runtime.policy import model_draft_cost
    from specrt.runtime.proposers.head import HeadProposer

    proposer: HeadProposer = gen._head_proposer(None, None)  # opens (once) and shares the Generator's head runner
    cost = model_draft_cost("head", m)
    if not seeded:
        verify = gen._load_costs[0] if gen._load_costs is not None else None
        cost = cost * float(verify[0] or 0.0) if verify is not None else 0.0
    return HeadSource(proposer.runner, fixed=seeded, cost_s=cost)
