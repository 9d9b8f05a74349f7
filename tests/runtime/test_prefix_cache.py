"""Prefix caching on real ONNX Runtime sessions: a request whose prompt starts with a stored prefix copies those KV
rows and prefills the rest; its greedy output equals the same request alone without the cache (fp32 and int4,
methods none / ngram / draft); the stored rows are bit-identical to a cold prefill's and stay so while the donor's
region moves and is reused; the store keeps its byte budget (LRU); 0 MiB turns it off."""

import numpy as np
import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.batch.engine import BatchEngine
from specrt.runtime.batch.prefix_cache import reusable_length
from specrt.runtime.batch.prefix_store import PrefixStore


@pytest.fixture(scope="module")
def engines(pair_bundle, lean_int4_bundle):
    from specrt.runtime import load

    out = {}
    for name, bundle in (("fp32", pair_bundle), ("int4", lean_int4_bundle)):
        gen = load(bundle, backend="ort")
        out[name] = (gen, BatchEngine(gen, max_batch=4))
    yield out
    for _, eng in out.values():
        eng.close()


def test_reusable_length_is_block_aligned_and_keeps_the_last_chunk_shape():
    assert reusable_length(50, 48, 16, 256) == 48
    assert reusable_length(49, 48, 16, 256) == 32  # one row left alone would be a one-row pass: 17 rows instead
    assert reusable_length(48, 48, 16, 256) == 32  # at least one row to prefill (its logits pick the first token)
    assert reusable_length(40, 0, 16, 256) == 0
    assert reusable_length(600, 592, 16, 256) == 592  # 8 rows left: as the cold 256+256+88 chunks, several rows
    assert reusable_length(257, 256, 16, 256) == 256  # the cold prefill ends with a one-row chunk: so does the hit
    assert reusable_length(257, 240, 16, 256) == 0  # a 17-row last chunk would not be the cold one-row one
    assert reusable_length(300, 288, 16, 8) == 288 and reusable_length(297, 288, 16, 8) == 288  # 9 = 8 + 1, as cold


def test_store_keeps_its_budget_and_evicts_least_recently_used_tails_first():
    block = np.zeros((4, 1, 2, 2), np.float32)  # 64 bytes
    store = PrefixStore(budget_bytes=4 * block.nbytes, block=2)
    a, b = np.arange(6), np.arange(100, 106)
    ka, kb = store.chain(a), store.chain(b)
    assert len(ka) == 3 and store.chain(a[:4]) == ka[:2] and store.chain(np.r_[a[:2], 9, 9])[0] == ka[0]
    assert store.chain(np.r_[a[:2], 9, 9])[1] != ka[1]
    for k in ka:
        assert store.put(k, block.copy())
    store.touch(ka)
    assert [len(store.match(a)), store.used_bytes] == [3, 3 * block.nbytes]
    for k in kb[:2]:
        store.put(k, block.copy())
    store.touch(kb[:2])
    assert store.used_bytes == 4 * block.nbytes == store.budget_bytes and store.evicted == 1
    assert len(store.match(a)) == 2  # a's LAST block went first: its first two still match
    assert not store.put(b"big", np.zeros((4, 1, 9, 2), np.float32))  # over the whole budget: not stored
    with pytest.raises(InvalidArgument, match="-5"):
        PrefixStore(-5)


def _prompts(gen, seed):
    base = np.random.default_rng(seed).integers(10, gen.vocab_size - 10, 50).tolist()
    # 50 tokens (3 full blocks stored), a 40-token shared head + a new tail (2 blocks hit), an extension (3 blocks),
    # and 33 tokens (2 blocks stored, but one row left would be a one-row pass: 1 block)
    return [base, base[:40] + [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], base + [3] * 20, base[:33]]


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("method", ["none", "ngram", "draft"])
def test_a_hit_gives_the_output_of_the_request_alone(engines, precision, method):
    gen, eng = engines[precision]
    prompts = _prompts(gen, seed=("fp32", "int4").index(precision) * 3 + ("none", "ngram", "draft").index(method))
    alone = [gen.generate(p, 10, method=method).token_ids for p in prompts]
    hits0 = eng.scheduler.prefix.hits
    got = [eng.generate_batch([p], 10, method=method)[0] for p in prompts]
    assert [r.token_ids for r in got] == alone
    assert [r.stats.cached_tokens for r in got] == [0, 32, 48, 16]
    assert eng.scheduler.prefix.hits - hits0 == 96
    together = eng.generate_batch(prompts, 10, method=method)  # several hits in one batch
    assert [r.token_ids for r in together] == alone
    assert all(r.stats.cached_tokens > 0 for r in together)


def _cold_rows(gen, ids, n):
    t = gen.target
    t.reset()
    t.forward_last(np.asarray(ids, np.int64))
    return np.stack([b[0, :, :n] for b in list(t.cache.keys) + list(t.cache.values)])


def test_stored_rows_equal_a_cold_prefill_and_survive_the_donor_region_moving_and_being_reused(engines):
    gen, eng = engines["fp32"]
    pc = eng.scheduler.prefix
    rng = np.random.default_rng(7)
    short, donor = rng.integers(10, 200, 20).tolist(), rng.integers(10, 200, 40).tolist()
    # the short request (region 0) ends first: the donor's region moves down (its rows copied), then it ends and
    # its region is reused by other prompts
    s1, e1 = eng.submit(short, max_new_tokens=2, method="none")
    s2, e2 = eng.submit(donor, max_new_tokens=12, method="none")
    from helpers import event_tokens

    event_tokens(e1), event_tokens(e2)
    eng.generate_batch([rng.integers(10, 200, 60).tolist() for _ in range(3)], 8, method="none")
    keys = pc.store.chain(np.asarray(donor))
    assert len(keys) == 2 and all(k in pc.store for k in keys)
    stored = np.concatenate(pc.store.rows(keys), axis=2)  # [2L, Hkv, 32, D]
    assert np.array_equal(stored, _cold_rows(gen, donor, 32))
    got = eng.generate_batch([donor + [1, 2, 3]], 8, method="none")[0]
    assert got.stats.cached_tokens == 32
    assert got.token_ids == gen.generate(donor + [1, 2, 3], 8, method="none").token_ids


def test_prefix_cache_off_and_bad_budgets(pair_bundle, engines):
    gen, _ = engines["fp32"]
    with pytest.raises(InvalidArgument, match="prefix_cache_mb.*-1"):
        BatchEngine(gen, max_batch=2, prefix_cache_mb=-1)
    with pytest.raises(InvalidArgument, match="'lots'"):
        gen.engine(max_batch=2, prefix_cache_mb="lots")
    with gen.engine(max_batch=2, prefix_cache_mb=0) as eng:
        p = np.random.default_rng(3).integers(10, 200, 40).tolist()
        a, b = eng.generate_batch([p], 6, method="none")[0], eng.generate_batch([p + [4, 5]], 6, method="none")[0]
        assert a.stats.cached_tokens == b.stats.cached_tokens == 0
        pc = eng.scheduler.prefix
        assert not pc.enabled and pc.hits == 0 and len(pc.store) == 0


def test_the_store_stays_within_a_small_budget(engines):
    gen, _ = engines["fp32"]
    with gen.engine(max_batch=2, prefix_cache_mb=0.02) as eng:  # 20 KiB: a few 8 KiB blocks of this toy model
        pc = eng.scheduler.prefix
        rng = np.random.default_rng(5)
        for _ in range(4):
            eng.generate_batch([rng.integers(10, 200, 48).tolist()], 2, method="none")
            assert 0 < pc.store.used_bytes <= pc.store.budget_bytes
        assert pc.store.evicted > 0 and len(pc.store) == pc.store.budget_bytes // pc.block_bytes


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_a_next_turn_reuses_the_answer_only_where_every_call_has_two_rows(engines, precision):
    # int4 at accuracy level 4 runs every call as two rows or more: an answer's rows equal a prefill's (measured,
    # scripts/prefix_rows.py), so they are stored; fp32 one-token decode rows differ from prefill rows: not stored
    gen, eng = engines[precision]
    prompt = np.random.default_rng(11).integers(10, 200, 40).tolist()
    first = eng.generate_batch([prompt], 40, method="ngram")[0]
    assert len(first.token_ids) == 40
    turn = prompt + first.token_ids + [7, 8, 9, 10, 11]
    got = eng.generate_batch([turn], 8, method="ngram")[0]
    assert got.token_ids == gen.generate(turn, 8, method="ngram").token_ids
    answer_rows = (len(prompt) + len(first.token_ids) - 1) // 16 * 16  # the last token has no row yet
    assert got.stats.cached_tokens == (answer_rows if precision == "int4" else 32)
    assert eng.scheduler.prefix.answers == (precision == "int4")


def test_a_hit_keeps_seeded_sampling_reproducible(engines):
    gen, eng = engines["fp32"]
    base = np.random.default_rng(21).integers(10, 200, 50).tolist()
    opts = dict(method="ngram", temperature=0.9, top_p=0.95, seed=5)
    eng.generate_batch([base], 4, **opts)
    got = eng.generate_batch([base + [9, 8, 7]], 16, **opts)[0]
    assert got.stats.cached_tokens == 48
    assert got.token_ids == gen.generate(base + [9, 8, 7], 16, **opts).token_ids
