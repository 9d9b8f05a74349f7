"""Token trees under batching: `auto` and `recycle` requests offer a scored tree each step; the plan sizes it.

A tree-proposing request (method auto: runtime/proposers/auto.py; recycle: runtime/proposers/recycle.py) gives the
plan, instead of a per-token acceptance, its **offer** (`TreeOffer`): every candidate node of this step with the
probability that its whole root path is accepted (runtime/tree_budget.py's estimates: auto's own, per (source,
depth, rank); recycle's kept here per (depth, rank) by `ScoredTree`). m nodes gain the sum of the m highest path
probabilities (a child's never exceeds its parent's, so they form a tree: tree_budget.choose's rule), and a pass of
m + 1 rows costs the cost table's `t_rows(m + 1)` (a tree pass costs what a chain of as many rows costs: measured,
docs/trees.md "Routes measured"). goodput.py picks m per request with the rest of the batch (m = 0: plain), then
`proposal` takes those m nodes.

Where trees run: a request's own pass on the fused family (its region, `tree_mask [S, S]` on the target's own
session, the single-sequence verify), then the accepted path's KV rows compacted in the region (`keep_path`,
O(depth) rows). The packed and ragged graphs have no tree input (runtime/backends/ort/tree_strip.py), so in a packed
step the same request verifies its most probable chain (`best_chain`), sized on that chain's probabilities.
Seeded sampling keeps the proposer's own sizing (fixed costs: the tree depends only on the request) and the fused
family, so its random numbers are those of its run alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specrt.runtime.proposers import auto, auto_offer
from specrt.runtime.proposers.base import Proposal
from specrt.runtime.tree_budget import NodeStats, best_chain, fixed_costs, path_probs, preorder

TREE_METHODS = ("auto", "recycle")


@dataclasses.dataclass(frozen=True)
class TreeOffer:
    """A request's scored candidates this step."""

    probs: np.ndarray  # [N] path probabilities, candidate order
    order: list[int]  # the candidates by falling path probability (at most the node budget)
    chain: list[int]  # the most probable chain's candidates, root first (at most the node budget)

    @classmethod
    def of(cls, probs: np.ndarray, parents: list[int], max_nodes: int) -> "TreeOffer":
        order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))[:max_nodes]
        return cls(probs, order, best_chain(probs, parents)[:max_nodes])

    def gains(self, chain: bool) -> list[float]:
        """[len(order) + 1] expected accepted drafts of the best m nodes (m = 0 ..), a tree's or the best chain's
        (past the chain's end a node more gains nothing)."""
        out = [0.0, *np.cumsum([self.probs[i] for i in (self.chain if chain else self.order)]).tolist()]
        return out + [out[-1]] * (len(self.order) + 1 - len(out))

    def nodes(self, m: int, chain: bool) -> list[int]:
        return sorted((self.chain if chain else self.order)[:m])


class ScoredTree:
    """A tree proposer without node probabilities of its own (recycle) made sizable: its tree for the node budget,
    each node estimated per (depth, rank among its siblings) from what the target committed (NodeStats), scored
    after every step. The proposer protocol is passed through (seeded requests call `propose` as alone)."""

    name = "recycle"

    def __init__(self, inner) -> None:
        self.inner = inner
        self.stats = NodeStats({"tree": auto.PRIORS["table"]})
        self._cand: tuple[list[int], list[int], list[list[tuple]]] | None = None
        self._probs = np.zeros(0)
        self._tokens, self._n = None, 0

    def start(self, tokens, n, target_hidden=None) -> None:
        self._tokens, self._n, self._cand = tokens, n, None
        self.inner.start(tokens, n, target_hidden)

    def propose(self, tokens, n, k) -> Proposal:
        return self.inner.propose(tokens, n, k)

    def observe(self, n, num_accepted, target_hidden=None) -> None:
        if self._cand is not None and n > self._n:
            self.stats.score(*self._cand, self._tokens[self._n:n].tolist())
        self._cand, self._n = None, n
        self.inner.observe(n, num_accepted, target_hidden)

    def observe_verify(self, fed_ids, logits, parents=None) -> None:
        self.inner.observe_verify(fed_ids, logits, parents)

    def scored(self, tokens, n, k) -> tuple[np.ndarray, list[int]]:
        prop = self.inner.propose(tokens, n, k)
        ids = prop.token_ids.tolist()
        parents = (prop.parents.tolist() if prop.parents is not None else list(range(-1, len(ids) - 1)))
        keys, depth, rank = [], [0] * (len(ids) + 1), {}
        for i, p in enumerate(parents):
            depth[i + 1] = depth[p + 1] + 1
            rank[p] = rank.get(p, -1) + 1
            keys.append([NodeStats.key("tree", depth[i + 1], rank[p])])
        self._probs = path_probs(parents, [self.stats.prob(ks[0]) for ks in keys])
        self._cand, self._tokens, self._n = (ids, parents, keys), tokens, n
        return self._probs, parents

    def take(self, chosen: list[int]) -> Proposal:
        ids, parents, _ = self._cand
        order = preorder(chosen, parents, self._probs)
        index = {node: j for j, node in enumerate(order)}
        par = np.array([index[parents[i]] if parents[i] >= 0 else -1 for i in order], dtype=np.int64)
        return Proposal(np.array([ids[i] for i in order], dtype=np.int64), parents=par, source=self.name)


def tree_proposer(gen, method: str, params, options: dict, state: "auto.AutoState", sources=None):
    """The batch's proposer for a tree method: `auto` without a draft-model or head source (a request's draft region
    is not one of its sources here), with the bundle's datastore where it has one, on the batch's shared state
    (`state`) or, seeded, a fresh one with fixed costs and the bundle's seed table as alone (runtime/proposers/auto.py
    `make_auto`); `recycle` wrapped in `ScoredTree`. `sources`: the request's resolved auto_sources
    (runtime/proposers/auto_sources.py; here of ngram, recycle and store)."""
    from specrt.runtime.proposers.auto_sources import batch_sources
    from specrt.runtime.proposers.recycle_table import request_table
    from specrt.runtime.proposers.store import store_for

    table = request_table(gen, params)  # seeded: a copy of the bundle's seed table, as alone
    if method == "recycle":
        from specrt.runtime.proposers.recycle import RecycleProposer

        return ScoredTree(RecycleProposer(table, gen.eos_ids, **options))
    if params.seed is not None and not params.greedy:
        state = auto.AutoState(fixed_costs(gen.max_draft_tokens + 1))
    use = batch_sources(sources)
    return auto.AutoProposer(table, state, gen.eos_ids, getattr(gen.target, "supports_tree", False), sources=use,
                             store=store_for(gen) if "store" in use else None, **options)  # None: no datastore


def batch_state(gen) -> "auto.AutoState":
    """The acceptance estimates the batch's unseeded `auto` requests share (their costs are the scheduler's)."""
    return auto.AutoState(fixed_costs(gen.max_draft_tokens + 1))


def offer(proposer, tokens: np.ndarray, n: int, max_nodes: int) -> TreeOffer | None:
    """The proposer's scored candidates for at most `max_nodes` nodes, or None (not a tree proposer)."""
    if isinstance(proposer, auto.AutoProposer):
        probs, parents = auto_offer.scored(proposer, tokens, n, max_nodes)
    elif isinstance(proposer, ScoredTree):
        probs, parents = proposer.scored(tokens, n, max_nodes)
    else:
        return None
    return TreeOffer.of(probs, parents, max_nodes)


def proposal(proposer, tree: TreeOffer, m: int, chain: bool) -> Proposal:
    """The m nodes the plan chose (the best chain's when `chain`)."""
    chosen = tree.nodes(m, chain)
    if isinstance(proposer, auto.AutoProposer):
        return auto_offer.take(proposer, chosen)
    return proposer.take(chosen)
