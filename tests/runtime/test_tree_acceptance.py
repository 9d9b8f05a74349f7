"""Acceptance on token trees (runtime/acceptance.py): deterministic cases with +-100 logits, lossless sampling on
trees (statistical, with a negative control that must fail), and greedy decoding with a tree proposer through the
loop on the toy bundle equal to plain decoding."""

import numpy as np
import pytest

from specrt.runtime.acceptance import greedy_accept_tree, rejection_sample_tree
from specrt.runtime.proposers.base import Proposal
from specrt.runtime.tree import first_chain

V = 8


def peaked(rows: list[int]) -> np.ndarray:
    """Logits [len(rows), V]: +100 at rows[i], -100 elsewhere (argmax certain)."""
    logits = np.full((len(rows), V), -100.0, np.float32)
    logits[np.arange(len(rows)), rows] = 100.0
    return logits


# root with children 1 (tok 3), 2 (tok 5); node 3 (tok 6) under 2; node 4 (tok 7) under 3; node 5 (tok 1) under 1
TOKENS = np.array([3, 5, 6, 7, 1], np.int64)
PARENTS = np.array([-1, -1, 1, 2, 0], np.int64)


@pytest.mark.parametrize("targets, path, token", [
    ([5, 0, 6, 7, 0, 0], [1, 2, 3], 0),  # the second branch all the way: bonus at the leaf (row 4 says 0)
    ([3, 1, 0, 0, 0, 2], [0, 4], 2),     # the first branch, then its child; bonus at leaf row 5
    ([3, 4, 0, 0, 0, 0], [0], 4),        # first child accepted, its child rejected: recovered = argmax at row 1
    ([2, 0, 0, 0, 0, 0], [], 2),         # no child matches: recovered at the root
    ([5, 0, 1, 0, 0, 0], [1], 1),        # second child, then no match under it
])
def test_greedy_tree_walks_the_longest_agreeing_path(targets, path, token):
    assert greedy_accept_tree(TOKENS, PARENTS, peaked(targets)) == (path, token)


def test_sampling_tree_with_certain_targets_matches_greedy():
    rng = np.random.default_rng(0)
    for targets, path, token in (([5, 0, 6, 7, 0, 0], [1, 2, 3], 0), ([2, 0, 0, 0, 0, 0], [], 2)):
        probs = np.exp(peaked(targets).astype(np.float64))
        probs /= probs.sum(-1, keepdims=True)
        assert rejection_sample_tree(TOKENS, PARENTS, probs, rng) == (path, token)


def test_proposal_validates_parents_and_reduces_to_its_first_chain():
    with pytest.raises(ValueError, match=r"parents\[1\]"):
        Proposal.point_mass(np.array([1, 2]), parents=np.array([-1, 1]))
    with pytest.raises(ValueError, match="shape"):
        Proposal.point_mass(np.array([1, 2]), parents=np.array([-1]))
    p = Proposal.point_mass(TOKENS, parents=PARENTS)
    assert first_chain(PARENTS).tolist() == [0, 4]
    assert p.chain().token_ids.tolist() == [3, 1] and p.chain().parents is None


# --- statistical: lossless on trees ------------------------------------------------------------------------------
# A toy target whose next-token distribution depends on the last token only: Q[last] [V]. Each step drafts a fixed
# tree of point masses from the last token (siblings may repeat a token); the first two emitted tokens of a
# generation must be distributed as Q[t0](x) Q[x](y).
STAT_PARENTS = np.array([-1, -1, -1, 0, 0, 1, 3], np.int64)
DRAWS = 100_000


def _draft_tree(last: int) -> np.ndarray:
    return np.array([(last + 1) % V, (last + 2) % V, (last + 1) % V, last, (last + 3) % V, 0, (last + 5) % V],
                    np.int64)


def _two_tokens(q_table, rng, rule) -> tuple[int, int]:
    out, last = [], 0
    while len(out) < 2:
        tokens = _draft_tree(last)
        rows = [last] + tokens.tolist()  # row r's context ends with this token
        path, token = rule(tokens, STAT_PARENTS, q_table[rows], rng)
        out += tokens[path].tolist() + [token]
        last = out[-1]
    return out[0], out[1]


def _tv(rule, seed: int) -> float:
    gen = np.random.default_rng(seed)
    q_table = gen.dirichlet(np.full(V, 0.5), size=V)
    q_table[:, -3:] *= 0.05  # uneven mass
    q_table /= q_table.sum(-1, keepdims=True)
    expected = q_table[0][:, None] * q_table  # [x, y]
    counts = np.zeros((V, V))
    rng = np.random.default_rng(seed + 1)
    for _ in range(DRAWS):
        x, y = _two_tokens(q_table, rng, rule)
        counts[x, y] += 1
    return 0.5 * np.abs(counts / DRAWS - expected).sum()


@pytest.mark.slow
def test_tree_sampling_is_lossless_and_an_always_accept_rule_is_not():
    assert _tv(rejection_sample_tree, 7) <= 0.02

    class AlwaysAccept:  # the negative control: every child test passes where q has any mass
        def __init__(self, rng):
            self.rng = rng

        def random(self):
            return 0.0

    def always(tokens, parents, probs, rng):
        path, token = rejection_sample_tree(tokens, parents, probs, AlwaysAccept(rng))
        return path, token

    assert _tv(always, 7) > 0.02


def test_tree_sampling_degenerate_inputs_give_valid_tokens():
    rng = np.random.default_rng(3)
    probs = np.zeros((STAT_PARENTS.size + 1, V))
    probs[:, 2] = 1.0  # point-mass target: every drafted token but 2 has zero mass
    for _ in range(200):
        path, token = rejection_sample_tree(_draft_tree(1), STAT_PARENTS, probs, rng)
        assert 0 <= token < V and not np.isnan(probs).any()
    probs = np.full((STAT_PARENTS.size + 1, V), 0.0)
    probs[:, [2, 3, 4, 6]] = 0.25  # the whole support drafted under the root, all rejected: still a valid draw
    for _ in range(200):
        _, token = rejection_sample_tree(np.array([2, 3, 4, 6, 0, 0, 0]), STAT_PARENTS, probs, rng)
        assert token in (2, 3, 4, 6)


def test_the_loop_keeps_k_nodes_and_falls_back_to_the_first_chain():
    from types import SimpleNamespace

    from specrt.runtime.proposers.base import POINT_MASS, SAMPLED, Proposal
    from specrt.runtime.step import tree_or_chain as cut

    def tree_or_chain(drafts, probs, parents, k, target, chain_only):
        proposal = Proposal(drafts, POINT_MASS if probs is None else SAMPLED, probs, parents=parents)
        verified = cut(proposal, k, target, chain_only)
        return verified.token_ids, verified.probs, verified.parents

    tokens, parents = np.arange(10, 16), np.array([-1, -1, 1, 0, 3, 4])  # first chain: drafts 0, 3, 4, 5
    trees = SimpleNamespace(supports_tree=True, tree_max_rows=1 << 30, length=5)
    d, p, par = tree_or_chain(tokens, None, parents, 4, trees, chain_only=False)
    assert d.tolist() == [10, 11, 12, 13] and par.tolist() == [-1, -1, 1, 0]  # the first k nodes: still a tree
    d, _, par = tree_or_chain(tokens, None, parents, 6, SimpleNamespace(length=5), chain_only=False)  # no trees
    assert d.tolist() == [10, 13, 14, 15] and par is None
    probs = np.eye(6)[:, :6]
    d, p, par = tree_or_chain(tokens, probs, parents, 6, trees, chain_only=True)  # a sampled draft model
    assert d.tolist() == [10, 13, 14, 15] and p.argmax(-1).tolist() == [0, 3, 4, 5] and par is None
    windowed = SimpleNamespace(supports_tree=True, tree_max_rows=3, length=5)
    d, _, par = tree_or_chain(tokens, None, parents, 6, windowed, chain_only=False)
    assert d.tolist() == [10, 11] and par.tolist() == [-1, -1]  # a tree of 3 rows: the runner's limit
