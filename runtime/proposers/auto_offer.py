"""The batch scheduler's hook into `auto` (runtime/batch/trees.py), kept apart from `AutoProposer.propose`: the
batch sizes a request's tree against its own cost table and the rest of the batch, so it asks for the scored
candidates (`scored`) and then takes the nodes it chose (`take`). Same candidates, estimates, order and scoring as
`propose` (no draft-model source: the batch builds auto without one)."""

from __future__ import annotations

import numpy as np

from specrt.runtime.proposers.auto import AutoProposer
from specrt.runtime.proposers.base import Proposal
from specrt.runtime.tree_budget import path_probs, preorder


def scored(proposer: AutoProposer, tokens: np.ndarray, n: int, k: int) -> tuple[np.ndarray, list[int]]:
    """This step's candidates of `proposer` (depth <= k): (path probabilities [N], parents [N]), kept for `take` and
    for the scoring after the step."""
    trie, keys = proposer.candidates(tokens, n, k)
    probs = path_probs(trie.parents, [max(proposer.state.stats.prob(key) for key in ks) for ks in keys])
    proposer._cand = (list(trie.tokens), list(trie.parents), keys)
    proposer._probs = probs
    return probs, list(trie.parents)


def take(proposer: AutoProposer, chosen: list[int]) -> Proposal:
    """The proposal of `chosen` (prefix-closed indices of the last `scored` candidates), ordered as `propose` orders
    its nodes (depth first, most probable child first)."""
    cand_tokens, parents, _ = proposer._cand
    order = preorder(chosen, parents, proposer._probs)
    proposer.state.last_nodes = len(order)
    ids = np.array([cand_tokens[i] for i in order], dtype=np.int64)
    index = {node: j for j, node in enumerate(order)}
    par = np.array([index[parents[i]] if parents[i] >= 0 else -1 for i in order], dtype=np.int64)
    return Proposal(ids, parents=par, source=proposer.name)
