"""The proposer protocol: every drafting method is one file implementing these three methods.

    start(tokens, n)               a new request; tokens[:n] is the prompt (+ first generated token)
    propose(tokens, n, k) -> Proposal   up to k draft tokens continuing tokens[:n]
    observe(n, num_accepted)       after verification: tokens[:n] is now committed; num_accepted of
                                   the last proposal's tokens were kept (methods with nothing to learn
                                   or roll back implement it as a no-op)

`tokens` is the loop's preallocated int64 array; proposers read it, never write it.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np


@dataclasses.dataclass
class Proposal:
    token_ids: np.ndarray  # [k'] int64, k' <= k (may be empty)
    probs: np.ndarray | None = None  # [k', V] draft distributions, or None for a point mass
    calls: int = 0  # model forward passes spent drafting


class Proposer(Protocol):
    name: str

    def start(self, tokens: np.ndarray, n: int) -> None: ...

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal: ...

    def observe(self, n: int, num_accepted: int) -> None: ...
