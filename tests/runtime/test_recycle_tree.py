"""Token Recycling's parts on their own: the successor table, the draft trie, n-gram branches, the proposer."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.proposers.ngram_branches import NgramBranches
from specrt.runtime.proposers.recycle import GIVE_UP, PATIENCE, RecycleProposer
from specrt.runtime.proposers.recycle_table import SuccessorTable
from specrt.runtime.proposers.token_tree import DraftTrie, expand_template, template


def check_tree(token_ids: np.ndarray, parents: np.ndarray, budget: int, vocab: int) -> None:
    assert token_ids.dtype == np.int64 and parents.dtype == np.int64 and token_ids.shape == parents.shape
    assert token_ids.size <= budget
    assert ((token_ids >= 0) & (token_ids < vocab)).all()
    assert all(-1 <= p < i for i, p in enumerate(parents.tolist())), parents  # topological, -1 = root
    siblings = list(zip(parents.tolist(), token_ids.tolist()))
    assert len(siblings) == len(set(siblings)), "two equal siblings: not deduplicated"


def test_table_refresh_keeps_each_rows_top_k_best_first():
    rng = np.random.default_rng(0)
    table = SuccessorTable(50, top_k=4)
    assert (table.succ == -1).all() and table.nbytes == 50 * 4 * 6  # bounded: V * K * (int32 id + float16 conf)
    logits = rng.standard_normal((3, 50)).astype(np.float32)
    table.refresh(np.array([7, 3, 49]), logits)
    for tok, row in zip((7, 3, 49), logits):
        assert table.row(tok).tolist() == np.argsort(-row)[:4].tolist()
    assert (table.succ[[0, 1, 2]] == -1).all()  # untouched tokens stay unknown
    # a screened row (exact only at its candidates, -inf elsewhere) keeps the old entries behind its finite ones
    screened = np.full((1, 50), -np.inf, dtype=np.float32)
    screened[0, [11, 12]] = [2.0, 1.0]
    old = table.row(7).tolist()
    table.refresh(np.array([7]), screened)
    assert table.row(7).tolist() == [11, 12] + [t for t in old if t not in (11, 12)][:2]
    # ids stay in range whatever the logits' width (a padded vocabulary is cut)
    table.refresh(np.array([5]), rng.standard_normal((1, 80)).astype(np.float32))
    assert table.succ.max() < 50 and table.succ.dtype == np.int32


def test_table_refresh_on_a_grouped_vocabulary_keeps_each_rows_top_k():
    """A vocabulary that is a multiple of 128 takes the grouped top-k (recycle_table.top_k_sorted)."""
    rng = np.random.default_rng(1)
    table = SuccessorTable(1024, top_k=8)
    logits = rng.standard_normal((5, 1024)).astype(np.float32)
    logits[1, 5::128] = 50.0 + np.arange(8)  # the whole top-8 in one residue class
    logits[2, 3:11] = 40.0  # ... in one contiguous run
    logits[3, :1000] = -np.inf  # a screened row: only 24 finite columns
    table.refresh(np.arange(5), logits)
    for tok, row in enumerate(logits):
        assert table.row(tok).tolist() == np.argsort(-row, kind="stable")[:8].tolist()  # equal values: lower first
    assert table.row(2).tolist() == list(range(3, 11))
    # a token fed twice in one pass (two tree nodes) keeps its last row, as a pass fed in order would
    table.refresh(np.array([9, 9]), logits[[0, 4]])
    assert table.row(9).tolist() == np.argsort(-logits[4], kind="stable")[:8].tolist()


@pytest.mark.parametrize("width", [80, 1024])  # partition / grouped top-k
def test_refresh_returns_numpys_argmax_of_every_row(width):
    """The argmax the greedy rule reuses is NumPy's (the first maximum), also where ties, infinities or a NaN make
    the top K alone undecided."""
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((7, width)).astype(np.float32)
    logits[1, [9, 40, 3]] = 5.0  # three equal maxima: the lowest column
    logits[2, :] = 1.0  # every column equal: column 0
    logits[2, width - 20:] = 1.0
    logits[3, :width - 3] = -np.inf  # a screened row with 3 finite columns
    logits[4, [17, 30]] = np.nan  # NumPy: the first NaN
    logits[5, [60, 11]] = np.inf  # the first +inf
    logits[6, 12:24] = 9.0  # more equal maxima than K
    table = SuccessorTable(width, top_k=8)
    assert table.refresh(np.arange(7), logits) == logits.argmax(axis=-1).tolist()
    assert table.refresh(np.arange(7), np.pad(logits, ((0, 0), (0, 4)))) is None  # wider than the table: not known


def test_table_learns_committed_pairs_and_resets_to_its_seed():
    seed = np.full((10, 3), -1, dtype=np.int32)
    seed[1] = [2, 3, 4]
    table = SuccessorTable(10, seed=seed)
    table.learn_pairs(np.array([1, 5]), np.array([4, 6]))
    assert table.row(1).tolist() == [4, 2, 3] and table.row(5).tolist() == [6, -1, -1]
    table.reset()  # a cold start: back to the seed
    assert table.row(1).tolist() == [2, 3, 4] and table.row(5).tolist() == [-1, -1, -1]
    with pytest.raises(InvalidArgument, match="successors per token"):
        SuccessorTable(10, top_k=0)


def test_trie_dedupes_prefixes_and_respects_the_budget():
    trie = DraftTrie(budget=5)
    assert trie.add_path([1, 2, 3]) == 3
    assert trie.add_path([1, 2, 4]) == 3  # shares [1, 2]: one new node
    assert trie.add_path([5, 6, 7]) == 1  # the budget (5 nodes) cuts the branch
    ids, parents = trie.arrays()
    assert ids.tolist() == [1, 2, 3, 4, 5] and parents.tolist() == [-1, 0, 1, 1, -1]
    assert trie.first_chain() == [1, 2, 3]
    check_tree(ids, parents, 5, 10)


def test_template_is_prefix_closed_and_best_first():
    paths = template(16)
    assert len(paths) == 16 and paths[0] == (0,)
    seen = set()
    for p in paths:
        assert p[:-1] == () or p[:-1] in seen
        seen.add(p)


def test_template_expansion_follows_the_table():
    succ = np.full((20, 3), -1, dtype=np.int32)
    succ[1] = [2, 3, 4]
    succ[2] = [5, 6, -1]
    succ[5] = [2, -1, -1]
    trie = DraftTrie(budget=6)
    expand_template(trie, succ, 1, template(12, ranks=3), eos_ids=frozenset({6}))
    ids, parents = trie.arrays()
    check_tree(ids, parents, 6, 20)
    pairs = {(ids[p] if p >= 0 else 1, t) for p, t in zip(parents.tolist(), ids.tolist())}
    assert all(t in succ[a] for a, t in pairs)  # every edge is a table successor
    assert trie.first_chain()[:3] == [2, 5, 2]


def test_ngram_branches_give_every_distinct_continuation():
    toks = np.array([1, 2, 3, 9, 1, 2, 4, 9, 1, 2], dtype=np.int64)
    nb = NgramBranches(frozenset(), 1, 3)
    nb.start(toks, toks.size)
    got = [c for _, c in nb.branches(toks, toks.size, depth=2, limit=4)]
    assert got[:2] == [[4, 9], [3, 9]]  # latest occurrence first, both continuations of "9 1 2"


def test_proposer_merges_ngram_and_table_into_one_tree():
    table = SuccessorTable(30, top_k=3)
    table.succ[2] = [7, 8, 9]
    table.succ[7] = [1, -1, -1]
    toks = np.zeros(64, dtype=np.int64)
    seq = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2]
    toks[:len(seq)] = seq
    prop = RecycleProposer(table, trees=True)
    prop.start(toks, len(seq))
    ids, parents, chain = prop.tree(toks, len(seq), 8)
    check_tree(ids, parents, 8, 30)
    roots = {int(t) for t, p in zip(ids, parents) if p == -1}
    assert {5, 3, 7} <= roots  # both n-gram continuations and the table's successor under the root
    assert len(chain) <= 8
    # chain form (a loop without trees): a plain Proposal of the first chain
    prop_chain = RecycleProposer(table, trees=False)
    prop_chain.start(toks, len(seq))
    proposal = prop_chain.propose(toks, len(seq), 4)
    assert 1 <= proposal.token_ids.size <= 4 and proposal.source in ("ngram", "ngram1", "table")


def test_proposer_falls_back_to_plain_when_its_drafts_stop_matching():
    table = SuccessorTable(30, top_k=2)
    toks = np.zeros(128, dtype=np.int64)
    toks[:6] = [1, 2, 3, 1, 2, 3]
    prop = RecycleProposer(table, trees=False)
    n = 6
    prop.start(toks, n)
    plain_from = None
    for step in range(12):
        proposal = prop.propose(toks, n, 4)
        if not prop.paying:
            assert proposal.token_ids.size == 0  # plain decoding: nothing to verify
            plain_from = step
            break
        # the target commits a token no source proposed first (from a small alphabet: the sources keep matching)
        firsts = {b[0] for b in prop._candidates.values() if b}
        toks[n] = min(t for t in (1, 2, 3, 4, 5) if t not in firsts)
        n += 1
        prop.observe(n, 0)
    assert plain_from is not None and plain_from <= PATIENCE + 2, plain_from
    assert max(prop.score.values()) < GIVE_UP
    prop.start(toks, n)  # a new request starts drafting again (the table is kept)
    assert prop.paying and prop.propose(toks, n, 4).token_ids.size > 0


def test_observe_verify_refreshes_the_table_from_the_verify_rows():
    """The loop's hook after a verify pass (tree verification calls it): every fed row's top-k, rejected nodes'
    rows included; the table then stops learning from committed pairs (the rows hold more)."""
    rng = np.random.default_rng(1)
    table = SuccessorTable(40, top_k=3)
    prop = RecycleProposer(table, trees=False)
    toks = np.zeros(32, dtype=np.int64)
    toks[:3] = [4, 5, 6]
    prop.start(toks, 3)
    fed = np.array([6, 9, 11, 9], dtype=np.int64)  # the pending token, then a tree's nodes (9 twice: two branches)
    logits = rng.standard_normal((4, 40)).astype(np.float32)
    prop.observe_verify(fed, logits, np.array([-1, 0, -1], dtype=np.int64))
    assert table.row(6).tolist() == np.argsort(-logits[0])[:3].tolist()
    assert table.row(11).tolist() == np.argsort(-logits[2])[:3].tolist()
    assert table.row(9).tolist() == np.argsort(-logits[3])[:3].tolist()  # the later row of the same token wins
    row6 = table.row(6).tolist()
    toks[3] = 33
    prop.observe(4, 0)
    assert table.row(6).tolist() == row6  # committed pairs no longer reorder rows
