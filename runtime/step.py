"""One decode step, the pieces every loop shares: propose -> verify -> accept -> commit.

The single-sequence loop (runtime/loop.py) runs them in order; the batching scheduler (runtime/batch/) runs the same
`accept` and `commit` on the rows of whatever pass verified a request (its own pass: `verify`, a packed pass, the
batched one-token pass). With `seq` a sequence being decoded (`Decoding`, or a `BatchSequence`: `tokens[:n]`
committed, its target holding the first n - 1 of them, the last one pending):
1. propose: the proposer's `Proposal` (k <= max draft tokens), cut to what the target verifies (`tree_or_chain`);
2. verify: one target pass over [tokens[n-1], d_1 .. d_k] (`verify`; a token tree in one pass where the runner has
   trees) -> logits [k + 1, V];
3. accept: the rule chosen by `Proposal.kind` and its shape (`accept`): greedy, rejection sampling of a point mass or
   of sampled drafts (Leviathan et al.), or a tree's longest agreeing path (SpecInfer) whose KV rows `keep_path`
   moves into place;
4. commit: the accepted drafts and the recovered / bonus token, cut after the first EOS, appended; the target
   truncated to n - 1 rows (O(1) rollback); the proposer observes; the stats count the tokens (`commit`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from specrt.runtime.acceptance import greedy_accept, greedy_accept_tree, rejection_sample, rejection_sample_tree
from specrt.runtime.proposers.base import SAMPLED, Proposal
from specrt.runtime.proposers.recycle_table import RowArgmax
from specrt.runtime.sampling import SamplingParams, sample, warp
from specrt.runtime.stats import GenerationStats
from specrt.runtime.tree import first_chain, is_chain


class SequenceState(Protocol):
    """What a step reads and commits to: `Decoding` (the loop) and `BatchSequence` (the scheduler)."""

    target: Any  # a Runner, a batching pool's region runner or slot
    tokens: np.ndarray  # [capacity] int64: tokens[:n] committed
    n: int
    proposer: Any  # Proposer | None
    stats: GenerationStats


@dataclasses.dataclass(eq=False)
class Decoding:
    """The single-sequence loop's sequence."""

    target: Any
    tokens: np.ndarray  # [capacity] int64
    n: int
    proposer: Any
    stats: GenerationStats


@dataclasses.dataclass(frozen=True)
class Accepted:
    """The acceptance rule's verdict: `path` the accepted draft indices root to leaf (a chain: 0 .. j-1), `token`
    the recovered token (at the first rejection) or the bonus token (all accepted)."""

    path: list[int]
    token: int

    @property
    def count(self) -> int:
        return len(self.path)

    def emitted(self, proposal: Proposal) -> list[int]:
        """The step's tokens before the EOS cut: the accepted drafts, then the recovered / bonus token."""
        ids = proposal.token_ids
        drafts = ids[:len(self.path)] if proposal.parents is None else ids[self.path]
        return drafts.tolist() + [self.token]


def no_drafts(tokens: np.ndarray) -> Proposal:
    """The proposal of a plain step (k = 0): the target's next token only."""
    return Proposal.point_mass(tokens[:0])


def pick_token(logits_row: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The next token from one row of logits [V] (a prefill's last row, a batched one-token pass's row)."""
    if params.greedy:
        return int(logits_row.argmax())
    return sample(warp(logits_row[None, :], params)[0], rng)


def tree_or_chain(proposal: Proposal, k: int, target: Any, chain_only: bool) -> Proposal:
    """The proposal as verified: at most k nodes (and the runner's tree rows) kept in topological order (a prefix of
    a tree is a tree); parents None for a chain. The first chain of the tree (the path of first children) where the
    runner has no tree input, the target has no past yet, or `chain_only` (a constraint, a sampled draft model,
    penalties: docs/trees.md)."""
    parents = proposal.parents
    if parents is None:
        return proposal
    trees = getattr(target, "supports_tree", False)  # runners that are not `Runner`s (a batch slot) verify chains
    keep = min(k, proposal.token_ids.size)
    if trees and not chain_only:
        keep = min(keep, max(target.tree_max_rows - 1, 1))
    drafts, parents = proposal.token_ids[:keep], parents[:keep]
    probs = proposal.probs[:keep] if proposal.probs is not None else None
    if is_chain(parents):
        return dataclasses.replace(proposal, token_ids=drafts, probs=probs, parents=None)
    if chain_only or not trees or target.length == 0:
        idx = first_chain(parents)
        return dataclasses.replace(proposal, token_ids=drafts[idx], probs=probs[idx] if probs is not None else None,
                                   parents=None)
    return dataclasses.replace(proposal, token_ids=drafts, probs=probs, parents=parents)


def verify(seq: SequenceState, verify_ids: np.ndarray, parents: np.ndarray | None = None) -> np.ndarray:
    """One target pass over the pending token and `verify_ids` [k] (a tree's nodes with `parents`) -> raw logits
    [k + 1, V]. The ids are written past tokens[:n] as scratch (what is emitted overwrites them). A proposer with
    `observe_verify` (Token Recycling) sees the fed rows and the raw logits."""
    return verify_rows(seq, verify_ids, parents)[0]


def verify_rows(seq: SequenceState, verify_ids: np.ndarray,
                parents: np.ndarray | None = None) -> tuple[np.ndarray, list[int] | None]:
    """`verify`, and the raw rows' argmax [k + 1] where the proposer's `observe_verify` returned it (the successor
    table's refresh finds it among each row's top K, exactly NumPy's argmax: `recycle_table.row_argmax`), else
    None. The greedy rule may take it instead of reading the rows again (`accept`), while the rows are raw."""
    n, kk = seq.n, verify_ids.size
    seq.tokens[n:n + kk] = verify_ids
    fed = seq.tokens[n - 1:n + kk]
    raw = seq.target.forward(fed) if parents is None else seq.target.forward(fed, parents)
    seq.stats.target_calls += 1
    observe_verify = getattr(seq.proposer, "observe_verify", None)
    argmax = observe_verify(fed.copy(), raw, parents) if observe_verify is not None else None
    return raw, argmax if isinstance(argmax, RowArgmax) and len(argmax) == fed.size else None


def accept(proposal: Proposal, logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           argmax: list[int] | None = None) -> Accepted:
    """proposal (drafts [k], a chain or a tree), logits [k + 1, V] of the pass that verified it -> the verdict.
    `argmax` (optional, greedy): the rows' argmax already computed, exactly `logits.argmax(-1)` (`verify_rows`).

    The rule: greedy sampling compares each draft with the target's argmax; otherwise rejection sampling over the
    warped rows, with the draft's probabilities when the proposal is `SAMPLED` and as a point mass (p(d) = 1) when
    it is `POINT_MASS`. A tree (`parents`) takes its longest agreeing root path (greedy) or SpecInfer's
    multi-candidate rule (point-mass drafts only: sampled trees are verified as their first chain)."""
    drafts, parents = proposal.token_ids, proposal.parents
    if parents is not None:
        if proposal.kind == SAMPLED:
            raise ValueError("a sampled proposal is verified as a chain (tree_or_chain with chain_only)")
        if params.greedy:
            path, token = greedy_accept_tree(drafts, parents, logits, argmax)
        else:
            path, token = rejection_sample_tree(drafts, parents, warp(logits, params), rng)
        return Accepted(path, token)
    if params.greedy:
        j, token = greedy_accept(drafts, logits, argmax)
        return Accepted(list(range(j)), token)
    q = warp(logits, params)
    p = proposal.probs if proposal.kind == SAMPLED else None
    if p is not None and p.shape[1] > q.shape[1]:  # a draft vocabulary larger than the target's
        q = np.pad(q, ((0, 0), (0, p.shape[1] - q.shape[1])))
    j, token = rejection_sample(drafts, p, q, rng)
    return Accepted(list(range(j)), token)


def keep_path(target: Any, past: int, path: list[int], hidden: np.ndarray | None) -> np.ndarray | None:
    """After a tree: the accepted path's KV rows moved to consecutive positions after `past` (O(depth) rows per
    layer); the target's hidden states [S, H] of the root and the path's rows, or None."""
    rows = [i + 1 for i in path]
    target.keep_path(past, rows)
    return hidden[[0, *rows]] if hidden is not None else None


def cut_at_eos(emitted: list[int], eos_ids: frozenset[int]) -> list[int]:
    """`emitted` up to and including its first EOS."""
    for i, t in enumerate(emitted):
        if t in eos_ids:
            return emitted[:i + 1]
    return emitted


def record(stats: GenerationStats, k: int, proposal: Proposal, accepted: Accepted) -> None:
    """The step's counts: k as planned, the drafts verified, those accepted, per drafting branch."""
    stats.record_step(k, proposal.token_ids.size, accepted.count, proposal.source)


def commit(seq: SequenceState, emitted: list[int], num_accepted: int, eos_ids: frozenset[int],
           hidden: np.ndarray | None = None, own: int | None = None) -> list[int]:
    """Append `emitted` (cut after its first EOS) to seq; its target keeps every committed token but the last; the
    proposer observes the new length (or, `own` of its tokens having been followed by forced ones, no further than
    its own) and the accepted count. Returns the tokens committed."""
    emitted = cut_at_eos(emitted, eos_ids)
    m = len(emitted)
    seq.tokens[seq.n:seq.n + m] = emitted
    seq.n += m
    seq.target.truncate(seq.n - 1)
    if seq.proposer is not None:
        seen = seq.n if own is None else min(seq.n, seq.n - m + own + 1)
        seq.proposer.observe(seen, num_accepted, hidden)
    seq.stats.new_tokens += m
    return emitted
