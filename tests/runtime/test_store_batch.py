"""The datastore under batching (runtime/batch/trees.py `tree_proposer`): batched `auto` requests on a copy of the toy
target-only bundle carrying a datastore of the model's own answers draft from it, several requests at once through
the batch engine on real ONNX Runtime sessions, each request's greedy output identical to it alone and to plain;
the request's auto_sources decide (`store` alone runs batched, `-store` leaves it out)."""

from __future__ import annotations

import shutil

import pytest

from helpers import event_tokens, fixed_costs

from specrt.runtime import load
from specrt.runtime.batch.goodput import CostTable
from specrt.runtime.proposers import auto_offer
from specrt.runtime.proposers.store import Datastore
from specrt.runtime.proposers.store_write import add_to_bundle

PROMPTS = ["def main(argv):\n    return", "the cat sat on the mat and the", "a b a b a b", "x = 1\ny = 2\nx ="]
LENGTHS = [18, 14, 16, 12]
CHEAP = CostTable(batch=[1.0, 1.02, 1.04, 1.06], rows=[0.1 + 0.001 * s for s in range(9)])


@pytest.fixture(scope="module")
def store_batch(target_only_bundle, tmp_path_factory):
    """The toy bundle with a datastore of its greedy answers to PROMPTS; its Generator and a 4-request engine."""
    path = tmp_path_factory.mktemp("store_batch") / "bundle"
    shutil.copytree(target_only_bundle, path)
    gen = load(path, threads=1, warmup=False)
    plain = [gen.generate(p, n, method="none").token_ids for p, n in zip(PROMPTS, LENGTHS)]
    add_to_bundle(path, Datastore.from_sequences(plain))
    gen = load(path, threads=1)
    with gen.engine(max_batch=4) as eng:
        yield gen, eng, plain


@pytest.fixture()
def cheap_rows(store_batch, monkeypatch):
    """CHEAP as the scheduler's costs (trees pay), without calibration against realized steps."""
    sched = store_batch[1].scheduler
    fixed_costs(sched, monkeypatch, CHEAP)  # monkeypatch restores the table after the test
    return sched


@pytest.fixture()
def offered(monkeypatch):
    """The sources of every candidate node the batch's auto requests offered (auto_offer.scored's keys)."""
    seen = []
    real = auto_offer.scored

    def spy(proposer, tokens, n, k):
        got = real(proposer, tokens, n, k)
        seen.extend(key[0] for keys in proposer._cand[2] for key in keys)
        return got

    monkeypatch.setattr(auto_offer, "scored", spy)
    return seen


def batched(eng, **opts):
    subs = [eng.submit(p, max_new_tokens=n, temperature=0, **opts) for p, n in zip(PROMPTS, LENGTHS)]
    return [(event_tokens(events), seq.stats) for seq, events in subs]


@pytest.mark.parametrize("sources", [None, "store"])
def test_batched_auto_drafts_from_the_store_with_plain_output(store_batch, cheap_rows, offered, sources):
    gen, eng, plain = store_batch
    got = batched(eng, auto_sources=sources)
    for (ids, _), want, p, n in zip(got, plain, PROMPTS, LENGTHS):
        assert ids == want == gen.generate(p, n, auto_sources=sources).token_ids
    assert {"store", "storeL"} & set(offered)  # the datastore's nodes were offered to the plan
    if sources == "store":  # every drafted node came from it, and they were accepted
        assert set(offered) <= {"store", "storeL"}
        assert sum(st.accepted_tokens for _, st in got) > 0 and sum(1 for _, st in got if st.accepted_tokens) >= 2
    assert eng.scheduler.targets.used == 0


def test_minus_store_leaves_it_out_under_batching(store_batch, cheap_rows, offered):
    gen, eng, plain = store_batch
    got = batched(eng, auto_sources="-store")
    assert [ids for ids, _ in got] == plain
    assert offered and not {"store", "storeL"} & set(offered)
