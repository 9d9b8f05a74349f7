"""Prompt lookup with several branches: the continuations of the suffix n-gram at its latest few occurrences.

`NgramProposer` (ngram.py) keeps one occurrence per n-gram (the latest) and proposes one chain. Where the
text holds the same n-gram before different continuations ("the cat sat" ... "the cat ran"), a tree can carry
them all: this index keeps the last `positions` occurrences per n-gram and `branches` returns the distinct
continuations, longest matching n-gram first, latest occurrence first within a size. Indexing is incremental
(O(max_n - min_n + 1) per committed token), a proposal O(branches * depth), independent of the context length.
A continuation that reaches the end of the text wraps with its period, as ngram.py does; each stops before the
first EOS.
"""

from __future__ import annotations

import numpy as np

from specrt.runtime.proposers.ngram import check_sizes

DEFAULT_POSITIONS = 4  # occurrences kept per n-gram


class NgramBranches:
    def __init__(self, eos_ids: frozenset[int] = frozenset(), min_n: int = 1, max_n: int = 3,
                 positions: int = DEFAULT_POSITIONS) -> None:
        check_sizes(min_n, max_n)
        self.eos_ids = eos_ids
        self.min_n, self.max_n, self.positions = min_n, max_n, max(int(positions), 1)
        self.tables: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self.indexed = 0

    def start(self, tokens: np.ndarray, n: int) -> None:
        self.tables = {size: {} for size in range(self.min_n, self.max_n + 1)}
        self.indexed = 0
        self.index(tokens, n)

    def index(self, tokens: np.ndarray, n: int) -> None:
        """Record every n-gram ending at e (exclusive) for e < n: followed by tokens[e]."""
        for e in range(max(self.indexed, 1), n):
            for size, table in self.tables.items():
                if e >= size:
                    starts = table.setdefault(tuple(tokens[e - size:e].tolist()), [])
                    starts.append(e)
                    if len(starts) > self.positions:
                        del starts[0]
        self.indexed = max(self.indexed, n - 1)

    def branches(self, tokens: np.ndarray, n: int, depth: int, limit: int) -> list[tuple[int, list[int]]]:
        """Up to `limit` distinct continuations (each up to `depth` tokens) as (matched n-gram size, tokens)."""
        out: list[tuple[int, list[int]]] = []
        self.starts: list[int] = []  # where each returned continuation starts in `tokens` (match_length)
        seen: set[tuple[int, ...]] = set()
        for size in range(self.max_n, self.min_n - 1, -1):
            if n < size:
                continue
            for start in reversed(self.tables[size].get(tuple(tokens[n - size:n].tolist()), ())):
                cont = tokens[start + np.arange(depth) % (n - start)].tolist()
                for i, t in enumerate(cont):
                    if t in self.eos_ids:
                        cont = cont[:i]
                        break
                key = tuple(cont)
                if not key or key in seen or any(s[:len(key)] == key for s in seen):
                    continue
                seen.add(key)
                out.append((size, cont))
                self.starts.append(start)
                if len(out) >= limit:
                    return out
        return out


def match_length(tokens: np.ndarray, n: int, start: int, cap: int) -> int:
    """How many tokens before `start` equal those before `n` (the suffix the continuation at `start` matches, as
    far back as it goes), up to `cap`: a long one means the text is being copied, where prompt lookup is right far
    more often than after a 2-token coincidence (auto.py keys its estimates by it)."""
    m = 0
    while m < cap and start - m - 1 >= 0 and tokens[start - m - 1] == tokens[n - m - 1]:
        m += 1
    return m
