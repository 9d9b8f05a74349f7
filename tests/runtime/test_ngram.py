"""n-gram (prompt lookup) proposer: table behaviour, and greedy/sampling losslessness end to end."""

import numpy as np
import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.proposers.ngram import NgramProposer


def run(seq, k=4, **kw):
    tokens = np.zeros(64, dtype=np.int64)
    tokens[: len(seq)] = seq
    p = NgramProposer(**kw)
    p.start(tokens, len(seq))
    return p.propose(tokens, len(seq), k).token_ids.tolist(), p, tokens


def test_no_match():
    assert run([1, 2, 3, 4])[0] == []


def test_longest_match_wins():
    # suffix (7, 8, 9): the 3-gram occurred once (continuation 50); the 1-gram "9" last occurred before 60
    seq = [7, 8, 9, 50, 51, 9, 60, 61, 7, 8, 9]
    assert run(seq, k=2, max_n=3)[0] == [50, 51]
    assert run(seq, k=2, max_n=1)[0] == [60, 61]


def test_latest_occurrence_wins():
    seq = [5, 6, 1, 1, 5, 6, 2, 2, 5, 6]
    assert run(seq, k=2, min_n=2, max_n=2)[0] == [2, 2]


def test_candidates_cut_at_eos_and_at_k_and_at_committed_end():
    seq = [3, 4, 10, 0, 11, 3, 4]
    assert run(seq, k=5, eos_ids=frozenset({0}))[0] == [10]
    assert run([3, 4, 10, 11, 12, 13, 3, 4], k=2)[0] == [10, 11]
    assert run([3, 4, 10, 3, 4], k=5)[0] == [10, 3, 4, 10, 3]  # wraps with the period of the repetition


def test_incremental_index():
    ids, p, tokens = run([1, 2, 3])
    assert ids == []
    tokens[3:6] = [9, 1, 2]
    p.observe(6, 0)
    assert p.propose(tokens, 6, 3).token_ids.tolist() == [3, 9, 1]


def test_bad_sizes():
    with pytest.raises(InvalidArgument):
        NgramProposer(min_n=3, max_n=2)


REPEATING = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_ngram_greedy_equals_plain(self_generator, k):
    plain = self_generator.generate(REPEATING, 40, method="none")
    spec = self_generator.generate(REPEATING, 40, method="ngram", num_speculative_tokens=k)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted_tokens > 0


def test_ngram_sampling_is_reproducible_and_valid(pair_generator):
    kw = dict(temperature=0.8, seed=5, method="ngram", num_speculative_tokens=4)
    a = pair_generator.generate(REPEATING, 30, **kw)
    assert a.token_ids == pair_generator.generate(REPEATING, 30, **kw).token_ids
    assert all(0 <= t < pair_generator.vocab_size for t in a.token_ids)


def test_period_one_repetition_fills_k():
    assert run([7, 5, 5, 5], k=4)[0] == [5, 5, 5, 5]
    assert run([1, 2, 1, 2], k=5, min_n=2)[0] == [1, 2, 1, 2, 1]
