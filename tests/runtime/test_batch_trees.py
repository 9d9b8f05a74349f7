"""Token trees under batching (runtime/batch/trees.py): batched `auto` / `recycle` requests verify their trees in own
passes of the fused family on real ONNX Runtime sessions, with greedy output identical to the request alone and to
plain decoding, several trees of different shapes at once, requests ending mid-batch, seeded sampling as alone;
the packed family verifies their best chains; the plan sizes a tree from its node probabilities and the costs."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import event_tokens, fixed_costs

from specrt.runtime import load
from specrt.runtime.batch import passes as batch_passes
from specrt.runtime.batch.goodput import CostTable, plan_packed, plan_step
from specrt.runtime.batch.trees import TreeOffer
from specrt.runtime.tree import is_chain

PROMPTS = ["def main(argv):\n    return", "the cat sat on the mat and the cat sat on the", "a b a b a b a b",
           "x = 1\ny = 2\nx = 1\ny ="]
LENGTHS = [20, 3, 16, 7]
CHEAP = CostTable(batch=[1.0, 1.02, 1.04, 1.06], rows=[0.1 + 0.001 * s for s in range(9)])


@pytest.fixture(scope="module")
def batch(target_only_bundle):
    gen = load(target_only_bundle, threads=1)
    with gen.engine(max_batch=4) as eng:
        yield gen, eng


@pytest.fixture()
def cheap_rows(batch, monkeypatch):
    """CHEAP as the scheduler's costs (own passes pay), without calibration against realized steps."""
    sched = batch[1].scheduler
    fixed_costs(sched, monkeypatch, CHEAP)  # monkeypatch restores the table after the test
    return sched


@pytest.fixture()
def verified(monkeypatch):
    """The parents array of every own pass the batch verifies (None: a chain)."""
    seen = []
    real = batch_passes.verify

    def spy(seq, ids, parents=None):
        seen.append(None if parents is None else parents.copy())
        return real(seq, ids, parents)

    monkeypatch.setattr(batch_passes, "verify", spy)
    return seen


def run(eng, prompts, lengths, **opts):
    subs = [eng.submit(p, max_new_tokens=n, **opts) for p, n in zip(prompts, lengths)]
    return [(event_tokens(events), seq.stats) for seq, events in subs]


@pytest.mark.parametrize("method", ["auto", "recycle"])
def test_batched_trees_give_the_output_alone_and_plain(batch, cheap_rows, verified, method):
    gen, eng = batch
    got = run(eng, PROMPTS, LENGTHS, method=method, temperature=0)
    for (ids, stats), p, n in zip(got, PROMPTS, LENGTHS):
        assert ids == gen.generate(p, n, method="none", temperature=0).token_ids
        assert ids == gen.generate(p, n, method=method, temperature=0).token_ids
        assert len(ids) == n or ids[-1] in gen.eos_ids  # the 3-token request ended while the others drafted trees
    trees = [p for p in verified if p is not None and not is_chain(p)]
    assert sum(st.tree_passes for _, st in got) == len(trees) > 0  # trees were verified in the batch
    assert sum(1 for _, st in got if st.tree_passes) >= 2  # several requests' trees
    if method == "recycle":  # auto's trees follow the table's confidences: on this toy model mostly chains
        assert len({tuple(p.tolist()) for p in trees}) >= 2  # of different shapes
    depth = {tuple(p.tolist()): max(_depths(p)) for p in trees}
    assert any(len(shape) > d for shape, d in depth.items())  # more nodes than the chain's length: branches
    assert eng.scheduler.targets.used == 0


@pytest.mark.parametrize("p", [0.99, 0.01])
def test_shared_batch_estimates_never_change_a_greedy_output(batch, cheap_rows, verified, monkeypatch, p):
    """Unseeded batched auto requests share the batch's acceptance estimates (docs/trees.md "Under batching"): what
    one request taught them sizes the others' trees. Whatever they hold (every node rated sure: the largest trees,
    mostly rejected; every node hopeless: plain steps), each request's greedy output is plain's."""
    gen, eng = batch
    monkeypatch.setattr(eng.scheduler.auto_state.stats, "prob", lambda key: p)
    got = run(eng, PROMPTS, LENGTHS, method="auto", temperature=0)
    for (ids, _), prompt, n in zip(got, PROMPTS, LENGTHS):
        assert ids == gen.generate(prompt, n, method="none", temperature=0).token_ids
    drafted = sum(st.drafted_tokens for _, st in got)
    if p > 0.5:  # drafts verified, and rejected ones among them
        assert drafted > sum(st.accepted_tokens for _, st in got) > 0
    else:
        assert drafted == 0


def test_dear_rows_keep_batched_tree_requests_plain(batch, cheap_rows, verified):
    gen, eng = batch
    cheap_rows.costs = CostTable(batch=[1.0, 1.02, 1.04, 1.06], rows=[5.0 + s for s in range(9)])
    got = run(eng, PROMPTS[:2], [12, 12], temperature=0)
    assert [ids for ids, _ in got] == [gen.generate(p, 12, method="none", temperature=0).token_ids
                                       for p in PROMPTS[:2]]
    assert not verified and sum(st.drafted_tokens for _, st in got) == 0


@pytest.mark.parametrize("method", ["auto", "recycle"])  # recycle: a copy of the seed table, not the shared one
def test_seeded_batched_trees_sample_as_alone(batch, cheap_rows, verified, method):
    gen, eng = batch
    opts = dict(method=method, temperature=0.9, top_k=20)
    seeds = [3, 11, 29]
    alone = [gen.generate(p, 14, seed=s, **opts) for p, s in zip(PROMPTS, seeds)]
    assert sum(r.stats.tree_passes for r in alone) > 0
    for _ in range(2):  # reproducible, beside a greedy request
        subs = [eng.submit(PROMPTS[3], max_new_tokens=10, temperature=0)]
        subs += [eng.submit(p, max_new_tokens=14, seed=s, **opts) for p, s in zip(PROMPTS, seeds)]
        got = [event_tokens(events) for _, events in subs]
        assert got[1:] == [r.token_ids for r in alone]
    assert any(p is not None and not is_chain(p) for p in verified)


def test_the_packed_family_verifies_best_chains(batch, cheap_rows, monkeypatch):
    from specrt.runtime.batch import family
    from specrt.runtime.batch.plan import PackedRowsPass

    gen, eng = batch
    monkeypatch.setattr(family, "MIN_FAMILY_STEPS", 0)
    monkeypatch.setattr(cheap_rows.chooser, "packed_ratio", 1.0)
    cheap_rows.costs = CostTable(batch=[10.0] * 4, rows=[10.0] * 9, packed=[[0.01 + 0.0001 * r for r in (1, 2, 5)]] * 3,
                                 packed_b=[1, 2, 4], packed_r=[1, 2, 5])
    packed = []  # the proposals packed passes verified
    real = cheap_rows.passes.run

    def spy(p):
        if isinstance(p, PackedRowsPass):
            packed.extend(d.proposal for d in p.decodes)
        return real(p)

    monkeypatch.setattr(cheap_rows.passes, "run", spy)
    got = run(eng, PROMPTS, LENGTHS, temperature=0)
    for (ids, stats), p, n in zip(got, PROMPTS, LENGTHS):
        assert ids == gen.generate(p, n, method="none", temperature=0).token_ids
    assert sum(d.token_ids.size for d in packed) > 0  # chains drafted and verified in packed passes
    assert all(d.parents is None for d in packed)  # the packed graph has no tree input


def test_the_plan_sizes_a_tree_from_its_node_probabilities():
    # candidates: root children a (0.9), b (0.5); a's child c (0.8): by falling path probability a, c, b
    offer = TreeOffer.of(np.array([0.9, 0.5, 0.72]), [-1, -1, 0], 4)
    assert offer.order == [0, 2, 1] and offer.chain == [0, 2]
    assert offer.gains(False) == pytest.approx([0.0, 0.9, 1.62, 2.12])
    assert offer.gains(True) == pytest.approx([0.0, 0.9, 1.62, 1.62])  # past the chain's end: nothing more
    assert offer.nodes(2, False) == [0, 2] and offer.nodes(3, True) == [0, 2]
    flat = CostTable(batch=[1.0], rows=[1.0, 1.01, 1.02, 1.03])
    assert plan_step([0.0], [3], [0.0], flat, gains=[offer.gains(False)]).ks == [3]  # rows nearly free: all
    steep = CostTable(batch=[1.0], rows=[1.0, 1.5, 2.9, 4.5])
    assert plan_step([0.0], [3], [0.0], steep, gains=[offer.gains(False)]).ks == [1]  # 1.9 / 1.5 beats 2.62 / 2.9
    assert plan_step([0.0], [3], [0.0], CostTable([1.0], [1.0, 3.0, 4.0, 5.0]), gains=[offer.gains(False)]).ks == [0]
    packed = CostTable(batch=[1.0], rows=[1.0], packed=[[1.0, 1.01, 1.02]] * 2, packed_b=[1, 4], packed_r=[1, 2, 4])
    assert plan_packed([0.0], [3], [0.0], packed, gains=[offer.gains(True)]).ks == [2]  # the chain's 2, no more


def _depths(parents):
    d = []
    for p in parents.tolist():
        d.append(1 if p < 0 else d[p] + 1)
    return d
