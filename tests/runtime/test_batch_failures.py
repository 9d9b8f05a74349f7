"""One request's failure inside a batched step ends that request with its error, never the batch or the engine
(runtime/batch/failures.py, docs/safety.md §4): a proposer that raises when it starts, offers its tree, observes the
committed tokens or refreshes its table from the verified rows, or that drafts a token id outside the vocabulary.
Real ONNX Runtime sessions (the toy fp32 bundle), four requests at once; the other three finish with plain's output
and every region is freed; the engine then serves the next request."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import event_tokens

from specrt.runtime import load
from specrt.runtime.batch import trees
from specrt.runtime.proposers import auto, auto_offer
from specrt.runtime.proposers.base import Proposal

PROMPTS = ["def main(argv):\n    return", "the cat sat on the mat and the cat sat on the", "x = 1\ny = 2\nx = 1\ny ="]
POISON = 311  # the poisoned request's prompt starts with this id (the others' do not)


class Poisoned(RuntimeError):
    pass


@pytest.fixture(scope="module")
def batch(target_only_bundle):
    gen = load(target_only_bundle, threads=1)
    with gen.engine(max_batch=4) as eng:
        yield gen, eng


def _poisoned(tokens) -> bool:
    return tokens is not None and int(tokens[0]) == POISON


def _raise_in(monkeypatch, name: str) -> None:
    real = getattr(auto.AutoProposer, name)

    def method(self, *args):
        tokens = args[0] if name in ("start", "candidates") else self._tokens
        if _poisoned(tokens):
            raise Poisoned(f"{name} failed")
        return real(self, *args)

    monkeypatch.setattr(auto.AutoProposer, name, method)


def _bad_ids(monkeypatch) -> None:
    real = auto_offer.take

    def take(proposer, chosen):
        prop = real(proposer, chosen)
        if _poisoned(proposer._tokens) and prop.token_ids.size:
            return Proposal(prop.token_ids + 10_000, parents=prop.parents, source=prop.source)
        return prop

    monkeypatch.setattr(auto_offer, "take", take)


@pytest.mark.parametrize("site", ["start", "candidates", "observe", "observe_verify", "bad ids"])
def test_a_failing_proposer_ends_its_request_only(batch, monkeypatch, site):
    gen, eng = batch
    sched = eng.scheduler
    # drafting always pays (so every site is reached), without calibration against this machine's timings
    monkeypatch.setattr(sched.chooser, "calibration", {"fused": 1.0, "packed": 1.0})
    monkeypatch.setattr(sched.chooser, "spec_calibration", {"fused": 1.0, "packed": 1.0})
    monkeypatch.setattr(sched.auto_state.stats, "prob", lambda key: 0.99)
    if site == "bad ids":
        _bad_ids(monkeypatch)
    else:
        _raise_in(monkeypatch, site)
    plain = [gen.generate(p, 16, method="none", temperature=0).token_ids for p in PROMPTS]
    assert all(gen.tokenizer.encode(p)[0] != POISON for p in PROMPTS)
    poisoned = [POISON, 5, 6, 7, 5, 6, 7, 5, 6]
    subs = [eng.submit(p, max_new_tokens=16, method="auto", temperature=0) for p in [PROMPTS[0], poisoned, *PROMPTS[1:]]]
    with pytest.raises(Exception) as err:
        event_tokens(subs[1][1])
    if site == "bad ids":
        assert "outside the vocabulary" in str(err.value)
    else:
        assert isinstance(err.value, Poisoned)
    assert subs[1][0].stats.finish_reason == "error"
    for (seq, events), want in zip([subs[0], *subs[2:]], plain):
        assert event_tokens(events) == want  # the others: plain's output, to the end
    assert sched.targets.used == 0 and not sched.running and not sched.prefilling
    assert eng.generate_batch([PROMPTS[0]], max_new_tokens=8, method="auto", temperature=0)[0].token_ids == plain[0][:8]


def test_a_failure_no_request_owns_still_ends_the_step_and_the_engine_serves_on(batch, monkeypatch):
    """A batched pass over every request failing ends them all with its error (nothing to pin it on); the next
    request runs."""
    gen, eng = batch
    sched = eng.scheduler
    real = sched.targets.decode_batch

    def broken(ids):
        raise Poisoned("the batched pass failed")

    monkeypatch.setattr(sched.targets, "decode_batch", broken)
    monkeypatch.setattr(sched.chooser, "choose", lambda *a: ("fused", None))
    subs = [eng.submit(p, max_new_tokens=8, method="none") for p in PROMPTS]
    for _, events in subs:
        with pytest.raises(Poisoned):
            event_tokens(events)
    monkeypatch.setattr(sched.targets, "decode_batch", real)
    assert len(eng.generate_batch(PROMPTS[:2], max_new_tokens=4, method="none")[1].token_ids) == 4
    assert sched.targets.used == 0
