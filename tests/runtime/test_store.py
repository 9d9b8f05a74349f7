"""The datastore of the target's own answers (runtime/proposers/store.py) and `auto`'s source `store`.

Lookups on small corpora (longest suffix, shares, sequence ends, EOS, budget); on a copy of the toy target-only
bundle: the store written into the bundle and checked at load (a modified file is refused), `auto` drafting from a
store of the model's own answer (nodes keyed `store`/`storeL`, accepted, output identical to plain), and a bundle
without one refusing the source with one clear message.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from specrt.core.errors import ChecksumMismatch, InvalidArgument
from specrt.runtime import load
from specrt.runtime.proposers.auto_sources import available
from specrt.runtime.proposers.store import CORPUS_FILE, Datastore
from specrt.runtime.proposers.store_write import add_to_bundle
from specrt.runtime.request import RequestFieldError

PROMPT = "the quick brown fox jumps over the lazy dog"


def tree_of(store, context, depth=4, budget=16, eos=frozenset()):
    ctx = np.array(context, dtype=np.int64)
    return store.tree(ctx, ctx.size, depth, budget, eos)


def test_the_longest_matching_suffix_gives_the_continuations_by_share():
    store = Datastore.from_sequences([[1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 7], [8, 3, 4, 5, 6], [3, 4, 5, 1]])
    # [2, 3, 4] occurs twice (then 5 6 / 7): the 3-token match wins over [3, 4]'s four occurrences
    nodes = tree_of(store, [0, 2, 3, 4])
    assert [(p, t, c, m) for p, t, c, m in nodes] == [(-1, 5, 0.5, 3), (-1, 7, 0.5, 3), (0, 6, 1.0, 3)]
    # [0, 3, 4] is not there, [3, 4] is: 5 follows it 3 times in 4, 7 once; after 5: 6 twice, 1 once
    nodes = tree_of(store, [0, 0, 3, 4])
    assert nodes[0] == (-1, 5, 0.75, 2) and nodes[1][1:] == (6, 2 / 3, 2) and nodes[1][0] == 0
    assert {(t, c) for p, t, c, _ in nodes if p == -1} == {(5, 0.75), (7, 0.25)}
    assert all(p < i for i, (p, *_) in enumerate(nodes))  # parents first
    assert tree_of(store, [42, 43]) == []  # nothing matches
    assert len(tree_of(store, [0, 0, 3, 4], budget=2)) == 2


def test_continuations_stop_at_a_sequence_end_and_before_eos():
    store = Datastore.from_sequences([[1, 2, 3], [2, 3, 0, 5]])
    assert tree_of(store, [1, 2, 3]) == []  # [1, 2, 3] ends its sequence: the next one is not its continuation
    assert [t for _, t, _, _ in tree_of(store, [2, 3])] == [0, 5]
    assert tree_of(store, [2, 3], eos=frozenset({0})) == []


def test_any_vocabulary_fits_and_matches_like_a_small_one():
    """Ids up to 150,000 (Qwen's 151k vocabulary) take 18 bits: 3 tokens in the packed key, the 4th a tail column;
    the lookups equal those of the same corpus with its ids renumbered below 65,535 (all 4 packed)."""
    rng = np.random.default_rng(0)
    small = [rng.integers(0, 6, size=int(n)) for n in rng.integers(3, 30, size=40)]  # 6 ids: many repeats
    ids = np.array([0, 7, 65535, 99_999, 131_072, 150_000])
    big = Datastore.from_sequences([ids[s] for s in small])
    ref = Datastore.from_sequences(small)
    assert (big.bits, big.packed, len(big.sorted_tails)) == (18, 3, 1) and (ref.packed, ref.sorted_tails) == (4, [])
    assert (big.order == ref.order).all()  # the stored layout does not depend on the packing
    for ctx in ([1, 2, 3, 4], [5, 5, 0, 1], [2, 3], [4], [0, 1, 2]):
        assert big.match(ids[ctx]) == ref.match(ctx)
        assert [(p, int(ids[t]), c, m) for p, t, c, m in tree_of(ref, ctx)] == tree_of(big, ids[ctx])
    for absent in ([150_001], [149_999], [0, 7, 65535, 7]):
        lo, hi = big.match(absent)
        assert hi == lo
    with pytest.raises(InvalidArgument, match=r"must lie in \[0, 2147483646\)"):
        Datastore.from_sequences([[1, 2**31]])
    with pytest.raises(InvalidArgument, match="not sorted"):
        Datastore(np.array([3, 2, 1], np.int32), np.array([0, 1, 2], np.int32))
    corpus = np.array([9, 9, 9, 150_000, 9, 9, 9, 1], np.int32)
    order = Datastore(corpus).order.copy()  # 4 (9 9 9 1) before 0 (9 9 9 150000): they differ in the tail only
    i, j = np.flatnonzero(order == 4)[0], np.flatnonzero(order == 0)[0]
    order[[i, j]] = order[[j, i]]
    with pytest.raises(InvalidArgument, match="not sorted"):  # the tail column is checked too
        Datastore(corpus, order)


@pytest.fixture(scope="module")
def store_bundle(target_only_bundle, tmp_path_factory):
    """A copy of the toy bundle with a datastore holding the model's own greedy answer to PROMPT."""
    path = tmp_path_factory.mktemp("store") / "bundle"
    shutil.copytree(target_only_bundle, path)
    gen = load(path, threads=1, warmup=False)
    answer = gen.generate(PROMPT, 40, method="none").token_ids
    add_to_bundle(path, Datastore.from_sequences([answer]))
    return path


def test_auto_drafts_from_the_store_and_output_stays_plain(store_bundle):
    gen = load(store_bundle, threads=1)
    assert "store" in available(gen)
    plain = gen.generate(PROMPT, 40, method="none").token_ids
    req = gen.request("generate", auto_sources="store")
    proposer = gen.make_proposer("auto", req.sampling, np.random.default_rng(0), {}, req.auto_sources)
    ids = gen.encode_prompt(PROMPT)
    tokens = np.zeros(gen.max_seq_len, np.int64)
    tokens[:ids.size], tokens[ids.size:ids.size + 3] = ids, plain[:3]
    n = ids.size + 3
    proposer.start(tokens, n)
    trie, keys = proposer.candidates(tokens, n, 4)
    assert {k[0] for ks in keys for k in ks} == {"storeL"}  # a 4-token match in the model's own answer
    assert trie.first_chain() == plain[3:7]
    res = gen.generate(PROMPT, 40, auto_sources="store")
    assert res.token_ids == plain and res.stats.accepted_tokens >= 10, res.stats
    assert gen.generate(PROMPT, 40).token_ids == plain  # every source together


def test_a_modified_store_is_refused(store_bundle, tmp_path):
    path = tmp_path / "bundle"
    shutil.copytree(store_bundle, path)
    corpus = np.load(path / CORPUS_FILE)
    corpus[0] = (corpus[0] + 1) % 50
    np.save(path / CORPUS_FILE, corpus)
    with pytest.raises(ChecksumMismatch, match="store/corpus.npy"):
        load(path, threads=1, warmup=False)


def test_a_bundle_without_a_store_refuses_the_source(target_only_bundle):
    gen = load(target_only_bundle, threads=1, warmup=False)
    assert "store" not in available(gen)
    with pytest.raises(RequestFieldError, match="auto source 'store' is not available with this bundle \\(it needs "
                                                "a bundle with a datastore"):
        gen.generate(PROMPT, 4, auto_sources="store")
