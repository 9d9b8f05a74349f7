"""Speculation-length policies: how many tokens to draft at the next step.

    next_k() -> int                 the k to try next (0 = plain decoding step)
    current_k -> int                the k it currently settles on (reported as num_speculative_tokens)
    update(k, drafted, accepted, draft_s, verify_s)   what the step measured

`FixedK` always answers the same k. `AdaptiveK` (adaptive.py) picks the k that maximises predicted
tokens per second from measured acceptance and costs.
"""

from __future__ import annotations


class FixedK:
    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self) -> int:
        return self.k

    @property
    def current_k(self) -> int:
        return self.k

    def update(self, k: int, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass
