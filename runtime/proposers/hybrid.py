"""Hybrid proposer: the n-gram continuation when the context has a match, the draft model otherwise.

The draft branch may also be a draft head (runtime/proposers/head.py), whose cache follows the committed
tokens the same way (features queued by `observe`, fed in one multi-row call by its next `propose`).

Text that repeats its input (edits, summaries quoting the source, code) is drafted for free by prompt lookup;
everywhere else the draft model drafts. Each proposal names its branch (`Proposal.source`), and the loop counts
steps, drafted and accepted tokens per branch in `GenerationStats.branches`.

The draft model's KV cache follows the committed tokens lazily, as it does on its own (draft_model.py): steps
drafted by the n-gram branch leave it behind, and the next draft-branch proposal first feeds every committed
token it has not seen in one multi-token pass (chunked like a prefill), then drafts. That is exact (the cache
then holds exactly tokens[:n - 1] + the pending token's pass) and cheaper than feeding it one token per n-gram
step. `observe` goes to both: the n-gram tables index the new tokens, the draft cache is cut back to the
longest prefix still committed. Both branches' proposals go through the same acceptance rule (point mass for
n-gram, the draft's probabilities when sampling), so output stays lossless; which branch drafts depends only
on the committed tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specrt.runtime.proposers.base import Proposal, Proposer
from specrt.runtime.proposers.draft_model import DraftModelProposer
from specrt.runtime.proposers.ngram import NgramProposer

DEFAULT_MIN_N = 2  # a one-token match is a weak predictor: leave those positions to the draft model
DEFAULT_MAX_N = 3


class HybridProposer:
    name = "hybrid"

    def __init__(self, ngram: NgramProposer, draft: DraftModelProposer | Proposer) -> None:
        self.ngram = ngram
        self.draft = draft

    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        self.ngram.start(tokens, n, target_hidden)
        self.draft.start(tokens, n, target_hidden)

    @property
    def matched(self) -> int:
        """The size of the suffix n-gram the n-gram branch last matched (0: none)."""
        return self.ngram.matched

    def free_propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal | None:
        """The n-gram branch's proposal when it matched (it costs nothing), else None: the draft model's would."""
        proposal = self.ngram.propose(tokens, n, k)
        return dataclasses.replace(proposal, source=NgramProposer.name) if proposal.token_ids.size else None

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        proposal = self.ngram.propose(tokens, n, k)
        source = NgramProposer.name
        if proposal.token_ids.size == 0:
            proposal = self.draft.propose(tokens, n, k)
            source = self.draft.name  # "draft" (a draft model) or "head" (a draft head)
        return dataclasses.replace(proposal, source=source)

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None:
        self.ngram.observe(n, num_accepted, target_hidden)
        self.draft.observe(n, num_accepted, target_hidden)
