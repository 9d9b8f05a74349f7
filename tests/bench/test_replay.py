"""The replay proposer: acceptance close to the simulated a, greedy output equal to plain."""

import numpy as np
import pytest

from specrt.bench import measure, predict
from specrt.core.errors import InvalidArgument
from specrt.runtime.proposers.replay import ReplayProposer
from specrt.runtime.sampling import SamplingParams


@pytest.mark.parametrize("a", [0.5, 0.9])
def test_corruption_rate_without_a_model(a):
    vocab, n = 50, 20_000
    reference = np.random.default_rng(1).integers(0, vocab, size=n)
    prop = ReplayProposer(reference, prompt_len=3, acceptance=a, vocab_size=vocab, rng=np.random.default_rng(2))
    tokens = np.zeros(n + 3, dtype=np.int64)
    kept = 0
    for start in range(0, n, 8):
        d = prop.propose(tokens, 3 + start, 8).token_ids
        ref = reference[start:start + 8]
        assert d.shape == ref.shape and d.dtype == np.int64 and (0 <= d).all() and (d < vocab).all()
        kept += int((d == ref).sum())  # a corrupted token never equals the original
    assert kept / n == pytest.approx(a, abs=0.015)


def test_past_the_reference_proposes_nothing_and_bad_acceptance():
    prop = ReplayProposer([5, 6, 7], prompt_len=2, acceptance=1.0, vocab_size=10)
    tokens = np.zeros(16, dtype=np.int64)
    assert prop.propose(tokens, 3, 4).token_ids.tolist() == [6, 7]
    assert prop.propose(tokens, 5, 4).token_ids.size == 0
    with pytest.raises(InvalidArgument):
        ReplayProposer([1], 1, acceptance=1.5, vocab_size=10)


@pytest.mark.parametrize("a", [0.5, 0.9])
def test_end_to_end_acceptance_and_greedy_equality(pair_generator, a):
    gen = pair_generator
    params = SamplingParams()
    accepted = drafted = accepted4 = rejected4 = 0
    for i, prompt in enumerate(["import os", "def main(", "class A:", "x = 1", "# comment", "return"]):
        ids = gen.encode_prompt(prompt)
        plain = measure.run_once(gen, ids, 96, "none", 0, params)
        for k in (1, 4):
            prop = ReplayProposer(plain.token_ids, ids.size, a, gen.vocab_size, np.random.default_rng(i * 10 + k))
            run = measure.run_once(gen, ids, 96, "replay", k, params, proposer=prop)
            assert run.token_ids == plain.token_ids  # lossless: greedy output unchanged
            if k == 1:  # with k = 1, accepted / drafted estimates a directly
                accepted += run.stats.accepted_tokens
                drafted += run.stats.drafted_tokens
            else:  # with k = 4, the per-token estimate accepted / (accepted + rejections)
                accepted4 += run.stats.accepted_tokens
                rejected4 += predict.count_rejections([(d, j) for _, d, j in run.steps])
    assert drafted > 200
    assert accepted / drafted == pytest.approx(a, abs=0.08)
    assert predict.alpha(accepted4, rejected4) == pytest.approx(a, abs=0.08)
