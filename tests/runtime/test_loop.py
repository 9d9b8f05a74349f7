"""End to end on real ONNX Runtime sessions: greedy speculative output == target-only output."""

import contextlib

import numpy as np
import pytest


@contextlib.contextmanager
def eos(generator, ids):
    """Temporarily replace the generator's EOS ids (random tiny models emit id 0 now and then)."""
    saved = generator.eos_ids
    generator.eos_ids = frozenset(ids)
    try:
        yield generator
    finally:
        generator.eos_ids = saved

PROMPTS = ["def main(argv):\n    ", "import os\nimport sys\n", "The quick brown fox"]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_unrelated_draft_greedy_equals_plain(pair_generator, k):
    for prompt in PROMPTS:
        plain = pair_generator.generate(prompt, 40, method="none")
        spec = pair_generator.generate(prompt, 40, method="draft", num_speculative_tokens=k)
        assert spec.token_ids == plain.token_ids
        assert spec.text == plain.text
        s = spec.stats
        assert s.drafted_tokens > 0
        assert s.accepted_tokens < s.drafted_tokens, "the rejection path must have run"
        assert sum(s.accepted_histogram) == s.verify_steps
        assert s.new_tokens == len(spec.token_ids) <= 40
        assert len(spec.token_ids) == 40 or spec.token_ids[-1] in pair_generator.eos_ids


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_draft_equal_to_target_accepts_everything(self_generator, k):
    with eos(self_generator, []):
        plain = self_generator.generate(PROMPTS[0], 50, method="none")
        spec = self_generator.generate(PROMPTS[0], 50, method="draft", num_speculative_tokens=k)
    assert spec.token_ids == plain.token_ids
    s = spec.stats
    assert s.acceptance_rate == 1.0
    # every step but the clamped tail drafts k and accepts k (+1 bonus)
    assert s.mean_accepted_tokens > min(k, 3)
    assert s.target_calls < plain.stats.target_calls


def test_plain_stats(pair_generator):
    with eos(pair_generator, []):
        res = pair_generator.generate(PROMPTS[1], 10, method="none")
    s = res.stats
    assert s.method == "none" and s.drafted_tokens == 0 and s.num_speculative_tokens == 0
    assert s.mean_accepted_tokens == 1.0 and s.verify_steps == 9 and s.target_calls == 10
    assert s.tokens_per_second > 0 and s.elapsed_s > 0


def test_stream_matches_generate(pair_generator):
    full = pair_generator.generate(PROMPTS[0], 30, method="draft", num_speculative_tokens=3)
    pieces = list(pair_generator.stream(PROMPTS[0], 30, method="draft", num_speculative_tokens=3))
    assert len(pieces) > 1
    assert "".join(pieces) == full.text


def test_max_new_tokens_never_exceeded(self_generator):
    with eos(self_generator, []):
        for n in (1, 2, 3, 7, 9):
            res = self_generator.generate(PROMPTS[2], n, method="draft", num_speculative_tokens=8)
            assert len(res.token_ids) == n and res.finish_reason == "length"


def test_prompt_at_context_limit(self_generator):
    with eos(self_generator, []):
        _prompt_at_context_limit(self_generator)


def _prompt_at_context_limit(self_generator):
    limit = self_generator.max_seq_len
    ids = self_generator.tokenizer.encode(" ".join(["word"] * 400))[: limit - 1]
    res = self_generator.generate(ids, 20, method="draft", num_speculative_tokens=8)
    assert len(res.token_ids) == 1 and res.finish_reason == "length"
    ids = ids[: limit - 5]  # drafts would overshoot the context: k is clamped
    res = self_generator.generate(ids, 20, method="draft", num_speculative_tokens=8)
    plain = self_generator.generate(ids, 20, method="none")
    assert res.token_ids == plain.token_ids and len(res.token_ids) == 5


def test_eos_inside_accepted_drafts(self_generator):
    """Make the EOS id one of the tokens the target emits: output stops right after it."""
    with eos(self_generator, []):
        plain = self_generator.generate(PROMPTS[0], 30, method="none")
    stop = plain.token_ids[12]
    first = plain.token_ids.index(stop)
    with eos(self_generator, [stop]):
        spec = self_generator.generate(PROMPTS[0], 30, method="draft", num_speculative_tokens=8)
        plain2 = self_generator.generate(PROMPTS[0], 30, method="none")
    assert spec.stats.accepted_histogram[-1] > 0  # drafts were accepted in bulk
    assert spec.token_ids == plain.token_ids[: first + 1] == plain2.token_ids
    assert spec.finish_reason == "stop"


def test_seed_makes_sampling_reproducible(pair_generator):
    kw = dict(temperature=0.9, top_p=0.95, seed=11, method="draft", num_speculative_tokens=4)
    a = pair_generator.generate(PROMPTS[0], 30, **kw)
    b = pair_generator.generate(PROMPTS[0], 30, **kw)
    c = pair_generator.generate(PROMPTS[0], 30, **{**kw, "seed": 12})
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def _exact_joint(generator, prompt_ids, params, steps):
    """Exact target-only distribution of the first `steps` tokens, by enumeration with the torch runner."""
    from specrt.runtime.sampling import warp

    target = generator.target
    dist = {}

    def rec(prefix, prob):
        if len(prefix) == steps:
            dist[tuple(prefix)] = dist.get(tuple(prefix), 0.0) + prob
            return
        target.reset()
        logits = target.forward(np.asarray(list(prompt_ids) + prefix, dtype=np.int64))[-1]
        q = warp(logits[None], params)[0]
        for t in np.flatnonzero(q):
            rec(prefix + [int(t)], prob * q[t])

    rec([], 1.0)
    return dist


def _sample_joint(generator, prompt_ids, method, n=3000):
    """n seeded 3-token samples (temperature 1.5, top-k 3, k = 2) through `method`: (total
    variation distance from the exact target-only joint, steps per drafting branch)."""
    from specrt.runtime.sampling import SamplingParams

    exact = _exact_joint(generator, prompt_ids, SamplingParams(temperature=1.5, top_k=3), 3)
    counts: dict = {}
    branch_steps: dict = {}
    rng = np.random.default_rng(0)
    for _ in range(n):
        res = generator.generate(prompt_ids, 3, temperature=1.5, top_k=3, seed=int(rng.integers(1 << 30)),
                                 method=method, num_speculative_tokens=2)
        key = tuple(res.token_ids)
        counts[key] = counts.get(key, 0) + 1
        for name, b in res.stats.branches.items():
            branch_steps[name] = branch_steps.get(name, 0) + b["steps"]
    assert set(counts) <= set(exact)
    keys = set(exact) | set(counts)
    tv = 0.5 * sum(abs(exact.get(key, 0.0) - counts.get(key, 0) / n) for key in keys)
    return tv, branch_steps


# 3000 sampled generations (10-20 s on the portable graph): the fused graph's run in the fast lane, both in the
# full run (the loop under test is the same code on either graph; both graphs' logits are checked elsewhere)
@pytest.mark.parametrize("pair_generator", ["ort", pytest.param("ort-portable", marks=pytest.mark.slow)],
                         indirect=True)
def test_sampling_end_to_end_follows_target_distribution(pair_generator):
    """Speculative sampling with an unrelated draft emits the target's joint distribution (top-k 3)."""
    tv, _ = _sample_joint(pair_generator, pair_generator.tokenizer.encode(PROMPTS[0]), "draft")
    # 27 outcomes, 3000 draws: sampling noise of the TV estimate is about 0.04
    assert tv < 0.08, f"total variation {tv:.3f} between speculative samples and the exact target distribution"
