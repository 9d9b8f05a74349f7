"""End to end on real ONNX Runtime sessions: under penalties and logit_bias speculative output equals plain
output (greedy), sampling stays lossless, and logprobs are the target's whatever drafted the token."""

import numpy as np
import pytest

from tests.runtime.test_loop import PROMPTS, eos

PENALTIES = [dict(presence_penalty=1.5), dict(frequency_penalty=1.0), dict(repetition_penalty=1.8),
             dict(repetition_penalty=0.6), dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2)]
ORT_ONLY = pytest.mark.parametrize("pair_generator", ["ort"], indirect=True)


@ORT_ONLY
@pytest.mark.parametrize("method", ["draft", "ngram"])
@pytest.mark.parametrize("penalty", PENALTIES)
def test_greedy_speculative_equals_plain_under_each_penalty(pair_generator, method, penalty):
    changed, drafted = False, 0
    with eos(pair_generator, []):
        for prompt in PROMPTS[:2]:
            free = pair_generator.generate(prompt, 30, method="none")
            plain = pair_generator.generate(prompt, 30, method="none", **penalty)
            spec = pair_generator.generate(prompt, 30, method=method, num_speculative_tokens=4, **penalty)
            assert spec.token_ids == plain.token_ids
            drafted += spec.stats.drafted_tokens
            changed |= plain.token_ids != free.token_ids
    assert drafted > 0
    assert changed, f"{penalty} did not change the output: the test would not see it applied"


@pytest.mark.parametrize("self_generator", ["ort"], indirect=True)
@pytest.mark.parametrize("penalty", PENALTIES)
def test_greedy_accepted_drafts_count_for_the_next_rows(self_generator, penalty):
    """The self bundle's draft is the target (without the penalty): most drafts are accepted, so row i of a
    verify pass must count drafts 1..i-1 for the output to equal plain decoding."""
    accepted = 0
    with eos(self_generator, []):
        for prompt in PROMPTS:
            plain = self_generator.generate(prompt, 40, method="none", **penalty)
            spec = self_generator.generate(prompt, 40, method="draft", num_speculative_tokens=4, **penalty)
            assert spec.token_ids == plain.token_ids
            accepted += spec.stats.accepted_tokens
    assert accepted > 0


@ORT_ONLY
@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_logit_bias_ban_and_boost_under_speculation(pair_generator, method):
    with eos(pair_generator, []):
        free = pair_generator.generate(PROMPTS[0], 30, method="none")
        boost = free.token_ids[5]
        banned = sorted(set(free.token_ids) - {boost})[:3]
        bias = {**{t: -100 for t in banned}, boost: 4.0}
        plain = pair_generator.generate(PROMPTS[0], 30, method="none", logit_bias=bias)
        spec = pair_generator.generate(PROMPTS[0], 30, method=method, num_speculative_tokens=4, logit_bias=bias)
    assert spec.token_ids == plain.token_ids != free.token_ids
    assert not set(banned) & set(plain.token_ids)


@pytest.mark.parametrize("self_generator", ["ort"], indirect=True)
@pytest.mark.parametrize("penalty", [{}, dict(frequency_penalty=0.8, logit_bias={5: 3.0}),
                                     dict(repetition_penalty=0.6)])
def test_logprobs_equal_across_methods(self_generator, penalty):
    """The self bundle's draft is the target: drafts are accepted, so logprobs of accepted drafts are compared."""
    runs = {}
    with eos(self_generator, []):
        for method in ("none", "draft", "ngram"):
            runs[method] = self_generator.generate(PROMPTS[1], 30, method=method, num_speculative_tokens=4,
                                                   logprobs=5, **penalty)
    plain = runs["none"]
    assert len(plain.logprobs) == len(plain.token_ids) == 30
    assert [t.token_id for t in plain.logprobs] == plain.token_ids
    for t in plain.logprobs:  # greedy: the emitted token is the top alternative
        assert len(t.top) == 5 and t.top[0][0] == t.token_id and t.logprob == pytest.approx(t.top[0][1])
    for method in ("draft", "ngram"):
        spec = runs[method]
        assert spec.token_ids == plain.token_ids and spec.stats.drafted_tokens > 0
        got = np.array([t.logprob for t in spec.logprobs])
        np.testing.assert_allclose(got, [t.logprob for t in plain.logprobs], atol=1e-4)
        for a, b in zip(spec.logprobs, plain.logprobs):
            np.testing.assert_allclose([p for _, p in a.top], [p for _, p in b.top], atol=1e-4)
    assert runs["draft"].stats.accepted_tokens > 0
    assert self_generator.generate(PROMPTS[1], 5, method="none").logprobs is None


def _exact_joint(generator, prompt_ids, temperature, top_k, penalty, steps):
    """Exact plain-sampling distribution of the first `steps` tokens under `penalty`, by enumeration."""
    from specrt.runtime.logits_processors import LogitsParams, process
    from specrt.runtime.sampling import SamplingParams, warp

    params, warping = LogitsParams(**penalty), SamplingParams(temperature=temperature, top_k=top_k)
    v = generator.vocab_size
    seen = np.zeros(v, bool)
    seen[prompt_ids] = True
    dist = {}

    def rec(prefix, prob):
        if len(prefix) == steps:
            dist[tuple(prefix)] = prob
            return
        generator.target.reset()
        logits = generator.target.forward(np.asarray(list(prompt_ids) + prefix, dtype=np.int64))[-1:]
        counts = np.bincount(np.asarray(prefix, dtype=np.int64), minlength=v).astype(np.int32)
        here = seen.copy()
        here[prefix] = True
        q = warp(process(logits, params, counts, here, np.array([], np.int64)), warping)[0]
        for t in np.flatnonzero(q):
            rec(prefix + [int(t)], prob * q[t])

    rec([], 1.0)
    return dist


# 1500 sampled generations and two enumerations: ~25 s on 2 busy cores
@pytest.mark.slow
@ORT_ONLY
def test_sampling_with_penalties_stays_lossless(pair_generator):
    """Speculative sampling (unrelated draft, k = 2) under penalties that depend on the position (counts of
    the tokens before it) and a bias emits the exact penalized target joint distribution (top-k 3)."""
    prompt_ids = pair_generator.tokenizer.encode(PROMPTS[0])
    unpenalized = _exact_joint(pair_generator, prompt_ids, 1.5, 3, {}, 3)
    first = max(unpenalized, key=unpenalized.get)[0]
    penalty = dict(frequency_penalty=-2.0, presence_penalty=-1.0, logit_bias={first: -1.5})
    exact = _exact_joint(pair_generator, prompt_ids, 1.5, 3, penalty, 3)
    n, counts, rng = 1500, {}, np.random.default_rng(0)
    with eos(pair_generator, []):
        for _ in range(n):
            res = pair_generator.generate(prompt_ids, 3, temperature=1.5, top_k=3, seed=int(rng.integers(1 << 30)),
                                          method="draft", num_speculative_tokens=2, **penalty)
            counts[tuple(res.token_ids)] = counts.get(tuple(res.token_ids), 0) + 1
    keys = set(exact) | set(counts) | set(unpenalized)
    tv = 0.5 * sum(abs(exact.get(k, 0.0) - counts.get(k, 0) / n) for k in keys)
    shift = 0.5 * sum(abs(exact.get(k, 0.0) - unpenalized.get(k, 0.0)) for k in keys)
    assert shift > 0.2, f"the penalty moves the distribution too little ({shift:.3f}) for the test to see it"
    # sampling noise of the TV estimate with 1500 draws over <= 27 outcomes is about 0.05
    assert tv < 0.1, f"total variation {tv:.3f} between speculative samples and the penalized target"


@pytest.mark.parametrize("self_generator", ["ort"], indirect=True)
@pytest.mark.parametrize("penalty", PENALTIES[:3])
def test_the_draft_model_sees_the_penalties(self_generator, penalty):
    """The self bundle's draft is the target: drafts processed like the target's rows (each with the drafts
    before it counted) are all accepted, greedy; without the penalties in the draft they would not be."""
    with eos(self_generator, []):
        plain = self_generator.generate(PROMPTS[0], 40, method="none", **penalty)
        spec = self_generator.generate(PROMPTS[0], 40, method="draft", num_speculative_tokens=4, **penalty)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.acceptance_rate == 1.0 and spec.stats.drafted_tokens > 0


@ORT_ONLY
def test_penalties_and_logprobs_match_transformers_generate(pair_generator, llama_target):
    """transformers' `generate` (greedy, SequenceBias then RepetitionPenalty: divide a positive logit, multiply a
    negative one, prompt tokens counted) gives the same tokens as every method, and its processed scores' log-softmax
    the same logprobs (docs/requests.md: specrt's logprobs come after the penalties and the bias)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(llama_target).eval()
    ids = pair_generator.tokenizer.encode(PROMPTS[0])
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, repetition_penalty=1.4,
                             sequence_bias={(5,): 3.0}, eos_token_id=None, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
    want = out.sequences[0, len(ids):].tolist()
    want_lp = [float(torch.log_softmax(s[0].double(), -1)[t]) for s, t in zip(out.scores, want)]
    with eos(pair_generator, []):
        free = pair_generator.generate(ids, 24, method="none")
        for method in pair_generator.methods:
            res = pair_generator.generate(ids, 24, method=method, repetition_penalty=1.4, logit_bias={5: 3.0},
                                          logprobs=0)
            assert res.token_ids == want, method
            np.testing.assert_allclose([t.logprob for t in res.logprobs], want_lp, atol=1e-4)
    assert free.token_ids != want  # the penalty changed the output: the comparison sees it applied
