"""Sizing a draft tree by goodput (runtime/tree_budget.py): pure functions of probabilities and measured costs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specrt.runtime.tree_budget import (NodeStats, PassCosts, best_chain, choose, fixed_costs, path_probs,
                                        preorder)

FP32 = [1.0, 1.05, 1.10, 1.15, 1.20, 1.26, 1.32, 1.38, 1.44]  # T(S)/T(1), S = 1..9 (docs/trees.md, SmolLM2 fp32)
INT4 = [1.0, 0.93, 1.12, 1.30, 1.49, 1.64, 1.79, 1.94, 2.09]  # int4: one row runs as two


def brute_force(probs, parents, costs, max_nodes):
    """The best prefix-closed node set by enumeration: its rate (1 + sum p) / T(S)."""
    best = 1.0 / costs[0]
    n = len(probs)
    for m in range(1, min(max_nodes, n) + 1):
        for subset in itertools.combinations(range(n), m):
            chosen = set(subset)
            if all(parents[i] < 0 or parents[i] in chosen for i in subset):
                best = max(best, (1 + sum(probs[i] for i in subset)) / costs[m])
    return best


def test_path_probabilities_multiply_along_the_path():
    parents = [-1, 0, 1, -1, 3]
    p = path_probs(parents, [0.5, 0.8, 0.5, 0.2, 1.0])
    assert np.allclose(p, [0.5, 0.4, 0.2, 0.2, 0.2])


@pytest.mark.parametrize("seed", range(6))
def test_choice_is_the_best_prefix_closed_tree(seed):
    rng = np.random.default_rng(seed)
    n = 8
    parents = [int(rng.integers(-1, i)) if i else -1 for i in range(n)]
    probs = path_probs(parents, rng.uniform(0.05, 0.95, n))
    for costs in (FP32, INT4):
        chosen = choose(probs, parents, costs, max_nodes=6, margin=1.0)
        assert all(parents[i] < 0 or parents[i] in chosen for i in chosen)  # a tree: every parent kept
        rate = (1 + probs[chosen].sum()) / costs[len(chosen)]
        assert rate == pytest.approx(brute_force(probs, parents, costs, 6))


def test_cheap_rows_take_big_trees_dear_rows_small_ones_and_bad_drafts_none():
    parents = list(range(-1, 7))  # a chain of 8, then 4 siblings of the root
    parents += [-1] * 4
    cond = [0.9] * 8 + [0.1] * 4
    probs = path_probs(parents, cond)
    free = choose(probs, parents, [1.0] * 13, max_nodes=12)
    assert len(free) == 12  # rows cost nothing: every candidate pays
    fp32 = choose(probs, parents, FP32, max_nodes=12)
    int4 = choose(probs, parents, INT4, max_nodes=12)
    assert len(fp32) == 8 and 1 <= len(int4) < len(fp32)  # rows cost: fewer nodes, the likely ones
    assert choose(path_probs(parents, [0.02] * 12), parents, FP32, max_nodes=12) == []  # plain decoding
    # the proposer's overhead is paid by plain steps too (candidates are scored every step): it amortises rows
    assert choose(path_probs(parents, [0.05] * 12), parents, FP32, max_nodes=12) == []
    assert choose(path_probs(parents, [0.05] * 12), parents, FP32, max_nodes=12, overhead_s=2.0) != []


def test_chain_only_targets_get_the_most_probable_chain_in_dfs_order():
    parents = [-1, -1, 0, 1, 3]
    probs = path_probs(parents, [0.4, 0.5, 0.9, 0.9, 0.9])
    assert best_chain(probs, parents) == [1, 3, 4]
    chosen = choose(probs, parents, [1.0] * 6, max_nodes=5, chain_only=True)
    assert chosen == [1, 3, 4]
    # a tree in depth-first order, most probable child first: its first chain is the best chain
    order = preorder(choose(probs, parents, [1.0] * 6, max_nodes=5), parents, probs)
    assert order == [1, 3, 4, 0, 2]


def test_node_stats_follow_the_recent_acceptance_and_score_unverified_candidates():
    stats = NodeStats({"s": ((0.6, 0.2), 0.8)})
    key = NodeStats.key("s", 1, 0)
    assert stats.prob(key) == 0.6 and stats.prob(NodeStats.key("s", 3, 1)) == pytest.approx(0.8 * 0.2 / 0.6)
    # candidates [5 -> 6], [7] under the root: the target committed 5, 6, 9
    tokens, parents = [5, 6, 7, 8], [-1, 0, -1, 1]
    keys = [[key], [NodeStats.key("s", 2, 0)], [NodeStats.key("s", 1, 1)], [NodeStats.key("s", 3, 0)]]
    assert stats.score(tokens, parents, keys, [5, 6, 9]) == 2  # the tree would have had 2 accepted
    assert stats.prob(key) > 0.6 and stats.prob(NodeStats.key("s", 1, 1)) < 0.2
    assert stats.prob(NodeStats.key("s", 3, 0)) < stats.prior(NodeStats.key("s", 3, 0))  # 8 != 9: a trial
    for _ in range(12):  # drafts that stop being accepted: the estimate falls with the recent rate (capped at
        stats.score(tokens, parents, keys, [4])  # FAST_CAP x the last ~5 trials' rate, whatever the long one says)
    assert stats.prob(key) < 0.06
    assert choose(path_probs(parents, [stats.prob(k[0]) for k in keys]), parents, FP32, 4) == []


def test_node_stats_keep_a_long_memory_but_follow_a_change_fast():
    """The estimate is the long rate (~20 trials: a few misses do not sink it), capped at FAST_CAP x the ~5-trial
    rate: a run of misses pulls it down within a few trials, whatever the long rate says."""
    from specrt.runtime import tree_budget as tb

    stats = NodeStats({"s": ((0.5,), 0.5)})
    key = NodeStats.key("s", 1, 0)
    for i in range(60):  # steady 80% acceptance, misses spread out
        stats.trial(key, i % 5 != 0)
    steady = stats.prob(key)
    assert 0.7 < steady < 0.9
    for _ in range(2):  # two misses in a row: the long rate barely moves, the cap does not bind
        stats.trial(key, False)
    assert stats.prob(key) > 0.6
    for _ in range(6):  # a change: six more misses
        stats.trial(key, False)
    c = stats.counts[key]
    assert c[0] / c[1] > 0.45  # the long rate alone would still draft
    assert stats.prob(key) == pytest.approx(tb.FAST_CAP * c[2] / c[3] + 0.01) and stats.prob(key) < 0.25


def test_pass_costs_scale_load_time_costs_by_what_steps_measure():
    costs = PassCosts([0.02, 0.019, 0.025])  # noise: a 2-row pass timed below a 1-row one
    assert costs.table() == pytest.approx([0.02, 0.02, 0.025])  # never cheaper with more rows
    for _ in range(40):
        costs.observe(3, 0.05)  # tree steps take twice the load-time figure (the loop's own work, a busy machine)
    assert costs.table()[2] == pytest.approx(0.05, rel=0.01) and costs.table()[0] == pytest.approx(0.02)
    for _ in range(40):
        costs.observe(1, 0.02)  # a long plain stretch: drafting passes are no longer assumed twice as dear
    assert costs.table()[2] < 0.03
    fixed = fixed_costs(4)
    fixed.observe(2, 10.0)
    assert fixed.table() == pytest.approx([1.0, 1.05, 1.10, 1.15])  # seeded sampling: never timed
    with pytest.raises(ValueError, match="positive seconds"):
        PassCosts([0.02, 0.0])


def test_free_rows_price_every_pass_at_one_row_and_take_every_candidate_up_to_the_cap():
    """`specrt bench --free-rows`: T(S) = T(1) (still learning T(1) from plain steps), so the sizing takes every
    candidate with any chance, up to the node cap, where the measured costs take few or none."""
    costs = PassCosts([0.02 * c for c in INT4], free_rows=True)
    assert costs.table() == pytest.approx([0.02] * 9)
    for _ in range(40):
        costs.observe(5, 0.2)  # slow drafting passes change nothing: rows are free
        costs.observe(1, 0.03)
    assert costs.table() == pytest.approx([costs.table()[0]] * 9) and costs.table()[0] > 0.025
    parents = list(range(-1, 7)) + [-1] * 4
    probs = path_probs(parents, [0.5] * 8 + [0.1] * 4)
    assert len(choose(probs, parents, costs.table(), max_nodes=8)) == 8
    assert len(choose(probs, parents, PassCosts([0.02 * c for c in INT4]).table(), max_nodes=8)) < 4
