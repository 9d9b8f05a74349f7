"""Continuous batching on a batch runner (runtime/batch/slots.py): the scheduler on the batched portable graph,
here ONNX Runtime's CPU provider (`backend="ort-portable"`, the code TensorRT's and PyTorch's batch runners share).
Every request's greedy output equals its output alone on the same backend, with other requests joining and
leaving; regions are virtual (a release moves no KV); a prompt chunk gets a pass of its own (over HTTP:
tests/serve/test_batching_server.py)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import event_tokens

from specrt.runtime.batch.engine import BatchEngine
from specrt.runtime.batch.slots import BatchRunnerPool

PROMPTS = ["hello world", "def f(x): return x + 1\ndef g(x): return", "a b a b a b a b a b", "the quick brown fox",
           "x", "import os\nimport sys\nimport os\n"]
LENGTHS = [12, 20, 7, 16, 9, 24]


@pytest.fixture(scope="module")
def portable_bundle(workdir, llama_target):
    from specrt.compiler import CompileSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "slots_portable", max_seq_len=64,
                                      max_draft_tokens=4, ort_graph="both"))


@pytest.fixture(scope="module")
def portable(portable_bundle):
    from specrt.runtime import load

    gen = load(portable_bundle, backend="ort-portable", threads=1)
    eng = BatchEngine(gen, max_batch=3)
    yield gen, eng
    eng.close()


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_greedy_output_equals_alone_with_requests_joining_and_leaving(portable, method, monkeypatch):
    gen, eng = portable
    pool = eng.scheduler.targets
    assert isinstance(pool, BatchRunnerPool) and pool.batch.name == "ort-portable"
    assert set(eng.scheduler.methods) == {"ngram", "none", "auto", "recycle"}
    alone = [gen.generate(p, n, method=method).token_ids for p, n in zip(PROMPTS, LENGTHS)]
    rows = []  # per pass: the new tokens of each slot
    real = pool.batch.forward_batch
    monkeypatch.setattr(pool.batch, "forward_batch",
                        lambda ids, first=0: rows.append([len(x) for x in ids]) or real(ids, first))
    # six requests on three slots: they queue, join as others leave, and prefill beside running decodes
    subs = [eng.submit(p, max_new_tokens=n, method=method, temperature=0) for p, n in zip(PROMPTS, LENGTHS)]
    got = [event_tokens(events) for _, events in subs]
    assert got == alone
    assert pool.used == 0
    assert max(sum(n > 0 for n in r) for r in rows) == 3  # passes of three requests at once
    if method == "ngram":
        assert any(max(r) > 1 and sum(n > 0 for n in r) > 1 for r in rows)  # a verify beside other requests


def test_sampling_runs_and_each_seed_repeats(portable):
    gen, eng = portable
    a = eng.generate_batch(PROMPTS[:3], 10, method="ngram", temperature=0.8, seed=7)
    b = eng.generate_batch(PROMPTS[:3], 10, method="ngram", temperature=0.8, seed=7)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert all(len(r.token_ids) >= 1 for r in a)


def test_regions_are_virtual_and_long_calls_run_alone(portable, monkeypatch):
    gen, eng = portable
    pool = eng.scheduler.targets
    passes = []
    real = pool.batch.forward_batch
    monkeypatch.setattr(pool.batch, "forward_batch",
                        lambda ids, first=0: passes.append((first, [len(x) for x in ids])) or real(ids, first))
    a, b, c = pool.acquire(), pool.acquire(), pool.acquire()
    try:
        assert [r.slot for r in (a, b, c)] == [0, 1, 2]
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, gen.vocab_size, n) for n in (3, 4, 5)]
        for r, p in zip((a, b, c), prompts):
            r.forward(p)
        assert passes[-1] == (2, [5])  # a slot alone runs a pass of its own slot only
        before = [k.copy() for k in pool.batch.keys]
        pool.release(b)  # region 1 freed: c becomes region 1, no KV moves
        for k0, k1 in zip(before, pool.batch.keys):
            np.testing.assert_array_equal(k0, k1)
        assert pool.region_of(c) == 1 and pool.used == 2
        d = pool.acquire()
        assert d.slot == 1 and pool.region_of(d) == 2  # the lowest free slot, as the next region
        passes.clear()
        long = rng.integers(0, gen.vocab_size, pool.pad_limit + 3)
        outs = pool.run([(0, np.array([7]), a.length, (0, 1)), (1, np.array([8, 9]), c.length, (0, 2)),
                         (2, long, d.length, (long.size - 1, 1))])
        assert passes == [(0, [1, 0, 2]), (1, [long.size])]  # decodes together (slot 1 sits out), the chunk alone
        assert [o.shape[0] for o in outs] == [1, 2, 1]
        assert (a.length, c.length, d.length) == (4, 7, long.size)
        # the same rows as each call alone
        ref = pool.batch
        for r, ids, got in ((a, np.array([7]), outs[0]), (c, np.array([8, 9]), outs[1])):
            r.truncate(r.length - ids.size)
            np.testing.assert_allclose(r.forward(ids), got, atol=1e-4, rtol=0)
        assert ref is pool.batch
    finally:
        for r in (d, c, a):
            pool.release(r)
    assert pool.used == 0


def test_cancel_frees_the_slot(portable):
    gen, eng = portable
    it = eng.stream_tokens("hello world", 40, method="none", temperature=0)
    next(it)
    it.close()
    import time

    deadline = time.time() + 20
    while eng.scheduler.targets.used and time.time() < deadline:
        time.sleep(0.05)
    assert eng.scheduler.targets.used == 0


def test_auto_max_batch_on_a_batch_runner(portable):
    from specrt.serve.batching import auto_max_batch

    gen, _ = portable
    assert auto_max_batch(gen) >= 1


def test_scheduler_on_the_pytorch_batch_runner(portable_bundle):
    """backend="torch": the same scheduler on the PyTorch reference's batch runner (what a CUDA device runs without
    TensorRT), on the Generator's own decoder module; greedy outputs as alone on that backend."""
    from specrt.runtime import load

    gen = load(portable_bundle, backend="torch")
    eng = BatchEngine(gen, max_batch=2)
    try:
        assert eng.scheduler.targets.batch.name == "torch"
        assert eng.scheduler.targets.batch.decoder is gen.target.decoder  # one weights copy
        alone = [gen.generate(p, 12, method="ngram").token_ids for p in PROMPTS[:3]]
        got = [r.token_ids for r in eng.generate_batch(PROMPTS[:3], 12, method="ngram")]
        assert got == alone
    finally:
        eng.close()
