"""min_p through the whole loop (docs/requests.md): min_p 1 keeps only the likeliest token, so every seed and method
gives greedy decoding's output; with min_p 0.5 every sampled sequence lies in the support of the exact target-only
distribution under the same warping (enumerated with the reference); seeded runs repeat, alone and batched."""

import numpy as np

from specrt.runtime.sampling import SamplingParams, warp

PROMPT = "def main(argv):\n    "
METHODS = ("none", "draft", "ngram", "auto")


def test_min_p_one_is_greedy_for_every_seed_and_method(pair_generator):
    greedy = pair_generator.generate(PROMPT, 16, method="none").token_ids
    for method in METHODS:
        for seed in (1, 2, 3):
            res = pair_generator.generate(PROMPT, 16, method=method, temperature=1.0, min_p=1.0, seed=seed)
            assert res.token_ids == greedy, (method, seed)


def _support(gen, prompt_ids, params, steps):
    """Every sequence of `steps` tokens the target alone can sample under `params` (reference runner)."""
    out, target = set(), gen.target

    def rec(prefix):
        if len(prefix) == steps:
            out.add(tuple(prefix))
            return
        target.reset()
        q = warp(target.forward(np.asarray(list(prompt_ids) + prefix, dtype=np.int64))[-1][None], params)[0]
        for t in np.flatnonzero(q):
            rec(prefix + [int(t)])

    rec([])
    return out


def test_sampled_tokens_stay_in_the_min_p_support(pair_generator):
    ids = pair_generator.tokenizer.encode(PROMPT)
    support = _support(pair_generator, ids, SamplingParams(temperature=0.7, min_p=0.5), 3)
    assert 8 < len(support) < 8 ** 3  # min_p keeps several tokens a step (~4 here), fewer than 8
    seen = set()
    for method in ("draft", "auto"):
        for seed in range(40):
            res = pair_generator.generate(ids, 3, method=method, num_speculative_tokens=2, temperature=0.7,
                                          min_p=0.5, seed=seed)
            assert tuple(res.token_ids) in support, (method, seed, res.token_ids)
            seen.add(tuple(res.token_ids))
    assert len(seen) > 1  # it sampled


def test_seeded_min_p_repeats_alone_and_batched(pair_generator):
    kw = dict(temperature=1.5, min_p=0.1, seed=5, method="auto")
    alone = pair_generator.generate(PROMPT, 20, **kw).token_ids
    assert pair_generator.generate(PROMPT, 20, **kw).token_ids == alone
    engine = pair_generator.engine(max_batch=2)
    try:
        batched = engine.generate_batch([PROMPT, PROMPT], 20, **kw)
    finally:
        engine.close()
    assert [r.token_ids for r in batched] == [alone, alone]
