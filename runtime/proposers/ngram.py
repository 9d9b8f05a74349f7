"""Prompt-lookup (n-gram) proposer: no second model.

Proposes the continuation of the longest suffix n-gram (max_n down to min_n tokens) of the committed
sequence that occurred earlier in prompt + generated text. Match rule: the LATEST earlier occurrence
wins (recent context is the better predictor in edited or repeated text). Candidates stop before the
first EOS; the loop clamps k at the context and max_new_tokens limits.

The n-gram tables are hash maps updated incrementally as tokens are committed, so a step costs
O(max_n - min_n + 1) look-ups, independent of the context length. When the continuation reaches the
end of the committed text (a repetition with period n - start), it wraps around with that period, so a
run like "a a a" or "ab ab ab" yields k tokens instead of stopping at the end. A deterministic proposal is a point
mass, so `probs` is None and the acceptance rule stays lossless for sampling too.
"""

from __future__ import annotations

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.runtime.proposers.base import Proposal

DEFAULT_MIN_N = 1
DEFAULT_MAX_N = 3
MAX_N_LIMIT = 32  # one hash table per size: bounds memory and per-step look-ups


def check_sizes(min_n: int, max_n: int) -> None:
    """1 <= ngram_min <= ngram_max <= MAX_N_LIMIT, integers."""
    for name, v in (("ngram_min", min_n), ("ngram_max", max_n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InvalidArgument(f"{name} must be an integer, got {v!r}")
    if not 1 <= min_n <= max_n <= MAX_N_LIMIT:
        raise InvalidArgument(f"n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= {MAX_N_LIMIT}, "
                              f"got {min_n}, {max_n}")


class NgramProposer:
    name = "ngram"

    def __init__(self, eos_ids: frozenset[int] = frozenset(), min_n: int = DEFAULT_MIN_N,
                 max_n: int = DEFAULT_MAX_N) -> None:
        check_sizes(min_n, max_n)
        self.eos_ids = eos_ids
        self.min_n, self.max_n = min_n, max_n
        self.tables: dict[int, dict[tuple[int, ...], int]] = {}
        self.indexed = 0  # tokens[:indexed] are in the tables (as n-grams that have a continuation)
        self._tokens: np.ndarray | None = None
        self.matched = 0  # size of the suffix n-gram the last `match` found (0: none)

    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        self.tables = {size: {} for size in range(self.min_n, self.max_n + 1)}
        self.indexed = 0
        self._tokens = tokens
        self._index(tokens, n)

    def _index(self, tokens: np.ndarray, n: int) -> None:
        """Record every n-gram ending at e (exclusive) for e < n, i.e. those followed by tokens[e]."""
        for e in range(max(self.indexed, 1), n):
            for size, table in self.tables.items():
                if e >= size:
                    table[tuple(tokens[e - size:e].tolist())] = e  # latest occurrence wins
        self.indexed = max(self.indexed, n - 1)

    def match(self, tokens: np.ndarray, n: int) -> int | None:
        """Start of the continuation of the longest matching suffix n-gram, or None. `matched`: its size (0: none),
        which predicts how well the proposal will be accepted (the batch scheduler keeps an estimate per size)."""
        for size in range(self.max_n, self.min_n - 1, -1):
            if n < size:
                continue
            start = self.tables[size].get(tuple(tokens[n - size:n].tolist()))
            if start is not None:
                self.matched = size
                return start
        self.matched = 0
        return None

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        start = self.match(tokens, n)
        if start is None:
            return Proposal.point_mass(tokens[:0].copy())
        period = n - start  # the match repeats with this period: continue the pattern past the end
        cand = tokens[start + np.arange(k) % period]
        for i, t in enumerate(cand.tolist()):
            if t in self.eos_ids:
                cand = cand[:i]
                break
        return Proposal.point_mass(cand)

    def free_propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        """The proposal made at no cost (the batch scheduler makes these before planning): all of them."""
        return self.propose(tokens, n, k)

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None:
        self._index(self._tokens, n)
