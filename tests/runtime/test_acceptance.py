"""The acceptance rule: deterministic ±100-logit cases and the 100k-draw statistical test."""

import numpy as np
import pytest

from specrt.runtime.acceptance import greedy_accept, rejection_sample


def peaked_logits(token_ids, vocab=10):
    logits = np.full((len(token_ids), vocab), -100.0, dtype=np.float32)
    logits[np.arange(len(token_ids)), token_ids] = 100.0
    return logits


@pytest.mark.parametrize(
    "drafts, target_argmax, accepted, nxt",
    [
        ([1, 2, 3], [1, 2, 3, 4], 3, 4),  # all accepted -> bonus token
        ([5, 2, 3], [1, 2, 3, 4], 0, 1),  # first rejected -> recovered token
        ([1, 7, 3], [1, 2, 3, 4], 1, 2),  # middle rejected
        ([], [6], 0, 6),  # zero drafts: bonus only (plain decoding step)
    ],
)
def test_greedy_cases(drafts, target_argmax, accepted, nxt):
    j, token = greedy_accept(np.array(drafts, dtype=np.int64), peaked_logits(target_argmax))
    assert (j, token) == (accepted, nxt)


@pytest.mark.parametrize("point_mass", [False, True])
def test_sampling_deterministic_cases(point_mass):
    rng = np.random.default_rng(0)
    q = np.zeros((4, 10))
    q[np.arange(4), [1, 2, 3, 4]] = 1.0
    p = None if point_mass else q[:3].copy()
    assert rejection_sample(np.array([1, 2, 3]), p, q, rng) == (3, 4)
    p2 = None if point_mass else np.eye(10)[[1, 9, 3]]
    j, token = rejection_sample(np.array([1, 9, 3]), p2, q, rng)
    assert (j, token) == (1, 2)  # d_2 has q = 0: rejected, recovered from q_2


def emitted_first_token_distribution(q, p, k, n, rng, sampler):
    """Draft from p, verify against q; return the empirical distribution of the first emitted token."""
    vocab = q.shape[-1]
    counts = np.zeros(vocab)
    target = np.repeat(q[None], k + 1, axis=0)
    draft_p = np.repeat(p[None], k, axis=0)
    cdf = np.cumsum(p)
    for _ in range(n):
        drafts = np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right").clip(max=vocab - 1)
        j, nxt = sampler(drafts, draft_p, target, rng)
        counts[drafts[0] if j > 0 else nxt] += 1
    return counts / n


def tv(a, b):
    return 0.5 * np.abs(a - b).sum()


def random_dist(rng, vocab, zero_frac=0.0):
    x = rng.random(vocab) ** 3
    x[rng.random(vocab) < zero_frac] = 0
    if x.sum() == 0:
        x[0] = 1
    return x / x.sum()


def always_accept(drafts, draft_p, target, rng):
    return len(drafts), int(np.argmax(target[-1]))


@pytest.mark.parametrize("k", [1, 3])
def test_statistical_lossless_and_negative_control(k):
    rng = np.random.default_rng(1234)
    vocab = 8
    q, p = random_dist(rng, vocab), random_dist(rng, vocab)
    got = emitted_first_token_distribution(q, p, k, 100_000, rng, rejection_sample)
    assert tv(got, q) < 0.02
    bad = emitted_first_token_distribution(q, p, k, 20_000, rng, always_accept)
    assert tv(bad, q) > 0.02, "the negative control must fail the same check"


def test_point_mass_proposer_is_lossless():
    """n-gram style: a deterministic proposal, draft_probs=None."""
    rng = np.random.default_rng(7)
    q = random_dist(rng, 10)
    counts = np.zeros(10)
    target = np.repeat(q[None], 3, axis=0)
    for _ in range(100_000):
        j, nxt = rejection_sample(np.array([3, 5]), None, target, rng)
        counts[3 if j > 0 else nxt] += 1
    assert tv(counts / counts.sum(), q) < 0.02


@pytest.mark.parametrize("case", ["p_equals_q", "sparse"])
def test_degenerate_inputs_give_valid_ids(case):
    rng = np.random.default_rng(3)
    vocab = 10
    for _ in range(2000):
        q = random_dist(rng, vocab, zero_frac=0.8 if case == "sparse" else 0.0)
        p = q.copy() if case == "p_equals_q" else random_dist(rng, vocab, zero_frac=0.8)
        drafts = np.array([rng.choice(vocab, p=p) for _ in range(3)])
        j, token = rejection_sample(drafts, np.repeat(p[None], 3, 0), np.repeat(q[None], 4, 0), rng)
        assert 0 <= j <= 3 and 0 <= token < vocab
        assert q[token] > 0, "an emitted token must have target probability > 0"
