"""Replay proposer (synthetic, for benchmarks): drafts the target's own greedy continuation, with each
token independently corrupted with probability 1 - a, at (almost) zero drafting cost.

It isolates the runtime's efficiency at a controlled acceptance rate on any target: under greedy
verification a draft is accepted exactly when it was not corrupted (and every draft before it was
accepted), so the per-token acceptance is `a` and the expected tokens per step are (1 - a^(k+1)) / (1 - a).

`reference` is the output of a plain greedy run of the same prompt (new tokens only, the first one
included). The committed sequence then always equals prompt + a prefix of the reference, so the draft
for position n is reference[n - prompt_len]. A corrupted token is replaced by a uniformly random other
token. Past the end of the reference nothing is proposed (the loop clamps k before that in practice).
Proposals are point masses (`probs` None); the proposer is for greedy benchmarks.
"""

from __future__ import annotations

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.runtime.proposers.base import Proposal


class ReplayProposer:
    name = "replay"

    def __init__(self, reference, prompt_len: int, acceptance: float, vocab_size: int,
                 rng: np.random.Generator | None = None) -> None:
        if not 0.0 <= acceptance <= 1.0:
            raise InvalidArgument(f"simulated acceptance must be in [0, 1], got {acceptance}")
        if vocab_size < 2:
            raise InvalidArgument(f"replay needs a vocabulary of at least 2 tokens, got {vocab_size}")
        self.reference = np.asarray(reference, dtype=np.int64)  # [N] greedy new tokens
        self.prompt_len = int(prompt_len)
        self.acceptance = float(acceptance)
        self.vocab_size = int(vocab_size)
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        pass

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        i = n - self.prompt_len
        draft = self.reference[max(i, 0):max(i, 0) + k].copy()  # [k'] the target's own continuation
        corrupt = self.rng.random(draft.size) >= self.acceptance  # [k'] bool, True with probability 1 - a
        if corrupt.any():
            shift = self.rng.integers(1, self.vocab_size, size=int(corrupt.sum()))
            draft[corrupt] = (draft[corrupt] + shift) % self.vocab_size  # never the original token
        return Proposal.point_mass(draft)

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None:
        pass
