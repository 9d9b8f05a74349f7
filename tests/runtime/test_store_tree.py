"""The datastore's lookup (runtime/proposers/store.py `Datastore.tree`, runtime/proposers/store_tree.py `grow`)
against a plain reference: occurrences found by scanning the corpus, picked evenly when there are more than
MAX_ROWS of them, and the tree grown with an `np.unique` and a heap entry per node (the lookup's first version).
Random small-vocabulary corpora give contexts with 1 to thousands of occurrences, so both of `grow`'s paths (plain
Python below SMALL rows, arrays above), the MAX_ROWS sampling, sequence ends and EOS are all exercised.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from specrt.runtime.proposers import store_tree
from specrt.runtime.proposers.store import MAX_MATCH, MAX_ROWS, SEP, Datastore
from specrt.runtime.proposers.store_tree import grow


def ref_occurrences(corpus: np.ndarray, suffix: list[int]) -> list[int]:
    """Positions right after each occurrence of `suffix` within one sequence, in the order `order` keeps them:
    by the MAX_MATCH tokens from the occurrence's start (id + 1; SEP and past the end 0), then by position."""
    c, n, L = corpus.tolist(), corpus.size, len(suffix)
    starts = [p for p in range(n - L + 1) if c[p:p + L] == suffix]
    key = lambda p: ([c[q] + 1 if q < n else 0 for q in range(p, p + MAX_MATCH)], p)  # noqa: E731
    keys = {p: key(p) for p in starts}
    for p in starts:  # SEP ends a key: what follows it is another sequence's
        k = keys[p][0]
        if 0 in k:
            keys[p] = (k[:k.index(0)] + [0] * (MAX_MATCH - k.index(0)), p)
    return [p + L for p in sorted(starts, key=keys.get)]


def ref_tree(corpus, context, depth, budget, eos=frozenset()):
    """The lookup spelled out: longest suffix (4 tokens down to 1) with an occurrence, its continuations, the heap."""
    corpus = np.asarray(corpus)
    for size in range(min(MAX_MATCH, len(context)), 0, -1):
        after = ref_occurrences(corpus, list(context[len(context) - size:]))
        if after:
            break
    else:
        return []
    if len(after) > MAX_ROWS:
        after = [after[i] for i in np.linspace(0, len(after) - 1, MAX_ROWS).astype(np.int64)]
    rows = []
    for p in after:
        row = []
        for q in range(p, p + depth):
            t = int(corpus[q]) if q < corpus.size else SEP
            if t == SEP or row and row[-1] == SEP:
                t = SEP
            row.append(t)
        rows.append(row)
    return ref_grow(np.array(rows), budget, size, eos)


def ref_grow(rows: np.ndarray, budget: int, size: int, eos=frozenset()):
    """A heap of every taken node's children in token order, an np.unique per node (rows cut at their first SEP)."""
    rows = np.where(np.cumsum(rows == SEP, axis=1) > 0, SEP, rows)
    total, depth, out, heap, count = rows.shape[0], rows.shape[1], [], [], 0

    def push(parent, members, d):
        nonlocal count
        if d >= depth:
            return
        toks, inv, counts = np.unique(rows[members, d], return_inverse=True, return_counts=True)
        for j, (t, c) in enumerate(zip(toks.tolist(), counts.tolist())):
            if t != SEP and t not in eos:
                heapq.heappush(heap, (-c / total, count, parent, t, c / members.size, members[inv == j], d + 1))
                count += 1

    push(-1, np.arange(total), 0)
    while heap and len(out) < budget:
        _, _, parent, t, cond, members, d = heapq.heappop(heap)
        out.append((parent, t, cond, size))
        push(len(out) - 1, members, d)
    return out


def random_corpus(rng, vocab, sequences, length):
    return [rng.integers(0, vocab, size=int(n)) for n in rng.integers(1, length, size=sequences)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lookups_offer_the_nodes_of_the_reference(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    seqs = random_corpus(rng, 5 + 3 * seed, 60, 80)  # ~2,400 tokens of 5-11 ids: contexts with 1 to ~500 rows
    store = Datastore.from_sequences(seqs)
    corpus = store.corpus
    rows_seen = set()
    for _ in range(60):
        ctx = rng.integers(0, 5 + 3 * seed + 1, size=int(rng.integers(1, 7))).tolist()  # the last id: never seen
        depth, budget = int(rng.integers(1, 9)), int(rng.choice([1, 5, 24, 64]))
        eos = frozenset(rng.choice(5, size=int(rng.integers(0, 2))).tolist())
        want = ref_tree(corpus, ctx, depth, budget, eos)
        ids = np.array(ctx, np.int64)
        size, lo, hi = store.longest(ids, ids.size)
        rows_seen.add(min(hi - lo, MAX_ROWS))
        for small in (0, 10**9):  # the array path and the plain one, on the same lookup
            monkeypatch.setattr(store_tree, "SMALL", small)
            store._memo.clear()
            assert store.tree(ids, ids.size, depth, budget, eos) == want, (ctx, depth, budget, eos, small)
        assert store.tree(ids, ids.size, depth, budget, eos) == want  # now from the memo
    assert min(rows_seen) <= 1 and max(rows_seen) == MAX_ROWS  # sampled ranges (linspace) and single rows both met


def test_grow_on_raw_rows_matches_the_reference(monkeypatch):
    """Rows with SEP in the middle (what follows it ignored), EOS, duplicates and ties, many rows or a few."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        r, d = int(rng.choice([1, 3, 40, 41, 300])), int(rng.integers(1, 10))
        rows = rng.integers(-1, 4, size=(r, d)).astype(np.int32)
        budget, eos = int(rng.choice([1, 7, 24, 1000])), frozenset({3}) if rng.random() < 0.5 else frozenset()
        want = ref_grow(rows, budget, 2, eos)
        for small in (0, 10**9):
            monkeypatch.setattr(store_tree, "SMALL", small)
            assert grow(rows, budget, 2, eos) == want
    assert grow(np.full((5, 3), SEP, np.int32), 24, 1) == [] and grow(np.zeros((0, 4), np.int32), 24, 1) == []


def test_longest_finds_what_match_finds_per_length_with_tail_columns_too():
    rng = np.random.default_rng(3)
    small = random_corpus(rng, 6, 40, 40)
    ids = np.array([0, 7, 65535, 99_999, 131_072, 150_000])  # 18 bits: 3 tokens packed, the 4th a tail column
    for store, to in ((Datastore.from_sequences(small), np.arange(6)), (Datastore.from_sequences([ids[s] for s in small]),
                                                                        ids)):
        for _ in range(200):
            ctx = to[rng.integers(0, 6, size=int(rng.integers(1, 6)))].tolist()
            if rng.random() < 0.2:
                ctx[int(rng.integers(0, len(ctx)))] = int(store.max_id) + 1  # an id the corpus never holds
            for min_match in (1, 2):
                want = (0, 0, 0)
                for size in range(min(MAX_MATCH, len(ctx)), min_match - 1, -1):
                    lo, hi = store.match(ctx[len(ctx) - size:])
                    if hi > lo:
                        want = (size, lo, hi)
                        break
                assert store.longest(np.array(ctx), len(ctx), min_match) == want


def test_the_memo_returns_copies_and_keeps_the_newest():
    store = Datastore.from_sequences([[1, 2, 3, 4], [1, 2, 5]])
    ctx = np.array([1, 2])
    first = store.tree(ctx, 2, 3, 8)
    first.append("changed by the caller")
    assert store.tree(ctx, 2, 3, 8) == [(-1, 3, 0.5, 2), (-1, 5, 0.5, 2), (0, 4, 1.0, 2)]
    assert store.tree(ctx, 2, 3, 8, frozenset({3})) == [(-1, 5, 0.5, 2)]  # EOS ids are part of the key
    assert len(store._memo) == 2
