"""The scheduler's hallways on real ONNX Runtime sessions: one proposer factory for the Generator and the scheduler,
the pool protocol both KV pools implement, typed step plans, and `abort_all` ending every request a failed step held."""

import collections
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import event_tokens

from specrt.core.errors import InvalidArgument
from specrt.runtime.proposers.build import HEAD_MISSING, Drafters, build_proposer
from specrt.runtime.proposers.draft_model import DraftModelProposer
from specrt.runtime.proposers.hybrid import DEFAULT_MIN_N, HybridProposer
from specrt.runtime.proposers.ngram import NgramProposer


@pytest.fixture(scope="module")
def gen(pair_bundle):
    from specrt.runtime import load

    return load(pair_bundle, backend="ort")  # the fused graph: region pools for the target and the draft


@pytest.fixture(scope="module")
def engine(gen):
    eng = gen.engine(max_batch=4)
    yield eng
    eng.close()


def test_one_factory_builds_every_method_or_names_what_the_bundle_lacks():
    eos = frozenset({2})
    assert build_proposer("none", eos, {}, Drafters()) is None
    ngram = build_proposer("ngram", eos, {"min_n": 1, "max_n": 2}, Drafters())
    assert isinstance(ngram, NgramProposer) and (ngram.min_n, ngram.max_n) == (1, 2)
    model = SimpleNamespace(name="draft")
    hybrid = build_proposer("hybrid", eos, {}, Drafters(draft=lambda: model))
    assert isinstance(hybrid, HybridProposer) and hybrid.draft is model and hybrid.ngram.min_n == DEFAULT_MIN_N
    head = SimpleNamespace(name="head")  # "hybrid" on a bundle with a draft head and no draft model
    assert build_proposer("hybrid", eos, {}, Drafters(head=lambda: head)).draft is head
    assert build_proposer("draft", eos, {}, Drafters(draft=lambda: model)) is model
    for method, missing in (("draft", "--draft"), ("hybrid", "--draft"), ("head", HEAD_MISSING),
                            ("hybrid-head", HEAD_MISSING), ("medusa", "--medusa"), ("bogus", "unknown method")):
        with pytest.raises(InvalidArgument, match=missing.replace("(", r"\(").replace(")", r"\)")):
            build_proposer(method, eos, {}, Drafters())


def test_the_generator_and_the_scheduler_build_the_same_proposers(gen, engine):
    params = gen.request("generate", 8, method="hybrid").sampling
    alone = gen.make_proposer("hybrid", params, np.random.default_rng(0), {})
    built = []
    proposer = engine.scheduler._proposer
    try:
        engine.scheduler._proposer = lambda s: built.append(proposer(s)) or built[-1]
        _, events = engine.submit("def g(x):", max_new_tokens=6, method="hybrid")
        event_tokens(events)
    finally:
        engine.scheduler._proposer = proposer
    for p in (alone, built[0]):
        assert isinstance(p, HybridProposer) and isinstance(p.draft, DraftModelProposer)
        assert (p.ngram.min_n, p.ngram.max_n) == (alone.ngram.min_n, alone.ngram.max_n)
    assert built[0].draft.lazy and not alone.draft.lazy  # the scheduler's draft prefills on its first draft


def test_both_kv_pools_implement_the_pool_protocol(engine):
    from specrt.runtime.batch.pool import RegionPool
    from specrt.runtime.batch.protocol import KVPool
    from specrt.runtime.batch.slots import BatchRunnerPool

    members = [m for m in dir(KVPool) if not m.startswith("_")] + list(KVPool.__annotations__)
    for pool_class in (RegionPool, BatchRunnerPool):
        pool_methods = [m for m in members if callable(getattr(KVPool, m, None))]
        assert all(callable(getattr(pool_class, m, None)) for m in pool_methods), pool_class
    pool = engine.scheduler.targets
    assert isinstance(pool, RegionPool)
    assert all(hasattr(pool, m) for m in members)


def test_a_step_is_a_typed_plan_run_pass_by_pass(engine, gen):
    from specrt.runtime.batch.plan import BatchedTokenPass, OwnPass, PackedRowsPass, PrefillPass, StepPlan

    sched = engine.scheduler
    plans = []
    plan = sched.plan

    def record(decode_only=False):
        plans.append(plan(decode_only))
        return plans[-1]

    sched.plan = record
    try:
        got = [r.token_ids for r in engine.generate_batch(["import os", "def f(x):", "a b a b a b"], 8,
                                                         method="ngram")]
    finally:
        sched.plan = plan
    alone = [gen.generate(p, 8, method="ngram").token_ids for p in ["import os", "def f(x):", "a b a b a b"]]
    assert got == alone
    assert plans and all(isinstance(p, StepPlan) for p in plans)
    kinds = {type(x) for p in plans for x in p.passes}
    assert kinds <= {OwnPass, BatchedTokenPass, PackedRowsPass, PrefillPass} and kinds & {PrefillPass, PackedRowsPass}
    decoding = [p for p in plans if p.decoding]
    assert decoding and all(p.family in ("fused", "packed") and p.goodput > 0 for p in decoding)
    assert all(p.then_decode and not p.decoding for p in plans if any(isinstance(x, PrefillPass) for x in p.passes))


def test_a_failed_step_ends_every_request_it_held_and_frees_every_region(engine, gen):
    sched = engine.scheduler
    run = sched.passes.run
    failing = {"on": True}

    def fail_once_decoding(p):
        if failing["on"] and sched.running:
            failing["on"] = False
            raise RuntimeError("the backend failed")
        return run(p)

    sched.passes.run = fail_once_decoding
    try:
        subs = [engine.submit(p, max_new_tokens=12, method="hybrid") for p in ("import os", "def f(x):")]
        for _, events in subs:
            with pytest.raises(RuntimeError, match="the backend failed"):
                event_tokens(events)
    finally:
        sched.passes.run = run
    assert sched.targets.used == 0 and sched.drafts.used == 0 and not sched.running and not sched.prefilling
    # the engine goes on: a new request gives its output alone
    _, events = engine.submit("import os", max_new_tokens=6, method="hybrid")
    assert event_tokens(events) == gen.generate("import os", 6, method="hybrid").token_ids


def test_abort_all_ends_queued_requests_too():
    from specrt.runtime.batch.scheduler import Scheduler

    ended = []
    held = [SimpleNamespace(emit=lambda x, s, i=i: ended.append((i, x))) for i in range(4)]
    pools = SimpleNamespace(used=3, release_all=lambda: setattr(pools, "used", 0))
    sched = SimpleNamespace(running=[held[0]], prefilling=[held[1]], waiting=collections.deque([held[2]]),
                            targets=pools, drafts=None)
    boom = RuntimeError("closed")
    Scheduler.abort_all(sched, boom, [held[3]])
    assert ended == [(0, boom), (1, boom), (2, boom), (3, boom)]  # running, in prefill, waiting, then queued
    assert pools.used == 0 and sched.running == [] and sched.prefilling == [] and not sched.waiting
