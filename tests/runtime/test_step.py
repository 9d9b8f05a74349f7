"""runtime/step.py: the decode step both loops run (accept by the proposal's kind and shape, commit), on arrays and on
a real ONNX Runtime target."""

import numpy as np
import pytest

from specrt.runtime.proposers.base import SAMPLED, Proposal
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.stats import GenerationStats
from specrt.runtime.step import Decoding, accept, commit, cut_at_eos, verify

GREEDY, SAMPLING = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)


def test_accept_takes_the_rule_of_the_proposals_kind():
    # q = [0.5, 0.5, 0, 0] at both rows; the draft token 1 drafted with p(1) = 0.1 (sampled) is accepted for sure
    # (q / p = 5), the same token as a point mass (p = 1) half of the time
    logits = np.log(np.array([[0.5, 0.5, 1e-12, 1e-12]] * 2))
    drafts = np.array([1])
    sampled = Proposal.sampled(drafts, np.array([[0.9, 0.1, 0.0, 0.0]]))
    point = Proposal.point_mass(drafts)
    rng = np.random.default_rng(0)
    assert all(accept(sampled, logits, SAMPLING, rng).count == 1 for _ in range(300))
    kept = np.mean([accept(point, logits, SAMPLING, rng).count for _ in range(2000)])
    assert 0.45 < kept < 0.55
    # a rejected point mass draws its recovered token from q with the draft zeroed: token 0 here
    verdicts = [accept(point, logits, SAMPLING, rng) for _ in range(200)]
    assert {v.token for v in verdicts if v.count == 0} == {0}
    # greedy: the target's argmax decides, whatever the kind
    sure = np.array([[-100.0, 100.0, -100.0, -100.0], [-100.0, -100.0, -100.0, 100.0]])
    for prop in (sampled, point):
        verdict = accept(prop, sure, GREEDY, rng)
        assert verdict.path == [0] and verdict.token == 3 and verdict.emitted(prop) == [1, 3]


def test_accept_walks_a_tree_and_refuses_a_sampled_one():
    # root -> drafts 0 (token 5) and 1 (token 6); draft 2 (token 7) under draft 1. The target's argmax: 6 after the
    # root, 7 after draft 1, 9 after draft 2: the path [1, 2] and the bonus token 9
    drafts, parents = np.array([5, 6, 7]), np.array([-1, -1, 1])
    logits = np.full((4, 10), -100.0)
    logits[0, 6] = logits[2, 7] = logits[3, 9] = logits[1, 0] = 100.0
    tree = Proposal.point_mass(drafts, parents=parents)
    verdict = accept(tree, logits, GREEDY, np.random.default_rng(0))
    assert verdict.path == [1, 2] and verdict.emitted(tree) == [6, 7, 9]
    sampled_tree = Proposal(drafts, SAMPLED, np.full((3, 10), 0.1), parents=parents)
    with pytest.raises(ValueError, match="chain"):
        accept(sampled_tree, logits, SAMPLING, np.random.default_rng(0))


def test_cut_at_eos_keeps_the_first_eos_only():
    assert cut_at_eos([4, 2, 5, 2], frozenset({2})) == [4, 2]
    assert cut_at_eos([4, 5], frozenset({2})) == [4, 5]


class _Observer:
    def __init__(self):
        self.seen = []

    def observe(self, n, num_accepted, hidden=None):
        self.seen.append((n, num_accepted))


def test_verify_then_commit_on_a_real_target(pair_generator):
    # the target holds every committed token but the last; a verify pass adds k + 1 rows; commit keeps the accepted
    # ones (cut after an EOS) and rolls the target back to n - 1 rows
    gen = pair_generator
    target = gen.target
    prompt = np.array(gen.encode_prompt("def f(x): return x + 1"), np.int64)
    n = prompt.size
    tokens = np.zeros(gen.max_seq_len, np.int64)
    tokens[:n] = prompt
    target.reset()
    target.forward(prompt[:-1])
    eos = next(iter(gen.eos_ids))
    seq = Decoding(target, tokens, n, _Observer(), GenerationStats())
    logits = verify(seq, np.array([11, eos, 13]))
    assert logits.shape == (4, gen.vocab_size) and target.length == n + 3 and seq.stats.target_calls == 1
    target.truncate(n - 1)
    alone = target.forward(tokens[n - 1:n + 3])  # the same rows as one plain call
    np.testing.assert_allclose(logits, alone, atol=1e-5)
    emitted = commit(seq, [11, eos, 13], 1, gen.eos_ids)
    assert emitted == [11, eos] and seq.n == n + 2 and tokens[n:n + 2].tolist() == [11, eos]
    assert target.length == n + 1 and seq.stats.new_tokens == 2 and seq.proposer.seen == [(n + 2, 1)]
    # the proposer's own tokens followed by forced ones: it saw no further than its own (+ the recovered token)
    verify(seq, np.array([21, 22]))
    commit(seq, [21, 22, 23], 2, gen.eos_ids, own=1)
    assert seq.n == n + 5 and target.length == n + 4 and seq.proposer.seen[-1] == (n + 4, 2)
    target.reset()
