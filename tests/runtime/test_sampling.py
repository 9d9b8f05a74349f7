import numpy as np
import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.sampling import SamplingParams, sample, warp


def test_warp_temperature_topk_topp():
    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]], dtype=np.float32))
    p = warp(logits, SamplingParams(temperature=1.0))
    assert np.allclose(p, [[0.5, 0.2, 0.15, 0.1, 0.05]], atol=1e-6)
    p = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert np.allclose(p, [[0.5 / 0.7, 0.2 / 0.7, 0, 0, 0]], atol=1e-6)
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5 + 0.2 < 0.8 -> keep 0.15 too
    assert np.allclose(p, [[0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0]], atol=1e-6)
    hot = warp(logits, SamplingParams(temperature=100.0))
    assert hot.max() - hot.min() < 0.01


def test_sample_follows_probs():
    rng = np.random.default_rng(0)
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(probs, rng) for _ in range(20000)], minlength=4) / 20000
    assert draws[1] == 0 and np.allclose(draws, probs, atol=0.02)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(top_k=-1), dict(temperature=float("nan")), dict(min_p=-0.1),
                                    dict(min_p=1.5), dict(min_p=float("nan"))])
def test_invalid_params(kwargs):
    with pytest.raises(InvalidArgument):
        SamplingParams(**kwargs)


def test_warp_equals_transformers_warpers():
    """temperature, then top-k, then top-p (the token that crosses top_p kept) as transformers' warpers, on random
    rows without ties (with ties, which of the tied tokens top-p keeps is each library's own order)."""
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(0)
    for _ in range(200):
        x = (rng.normal(size=(1, 40)) * rng.choice([0.3, 1.0, 5.0])).astype(np.float32)
        t, k, p = float(rng.choice([0.5, 1.0, 2.0])), int(rng.choice([0, 1, 3, 10])), float(rng.choice([1.0, 0.9, 0.3]))
        scores = TemperatureLogitsWarper(t)(None, torch.tensor(x))
        scores = TopKLogitsWarper(k)(None, scores) if k else scores
        scores = TopPLogitsWarper(p)(None, scores) if p < 1 else scores
        want = torch.softmax(scores.double(), -1).numpy()
        np.testing.assert_allclose(warp(x, SamplingParams(temperature=t, top_k=k, top_p=p)), want, atol=1e-9)


def test_min_p_equals_transformers_warper():
    """min-p after temperature, top-k and top-p, as transformers' MinPLogitsWarper (and vLLM) apply it: tokens below
    min_p x the likeliest token's probability dropped, the rest renormalised."""
    import torch
    from transformers.generation.logits_process import MinPLogitsWarper, TemperatureLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(1)
    dropped = 0
    for _ in range(200):
        x = (rng.normal(size=(1, 40)) * rng.choice([0.3, 1.0, 5.0])).astype(np.float32)
        t, p, m = float(rng.choice([0.5, 1.0, 2.0])), float(rng.choice([1.0, 0.9])), float(rng.choice([0.05, 0.3, 1.0]))
        scores = TemperatureLogitsWarper(t)(None, torch.tensor(x))
        scores = TopPLogitsWarper(p)(None, scores) if p < 1 else scores
        scores = MinPLogitsWarper(m)(None, scores)
        want = torch.softmax(scores.double(), -1).numpy()
        got = warp(x, SamplingParams(temperature=t, top_p=p, min_p=m))
        np.testing.assert_allclose(got, want, atol=1e-9)
        dropped += int((got == 0).sum() > (warp(x, SamplingParams(temperature=t, top_p=p)) == 0).sum())
    assert dropped > 50  # min-p removed tokens in most rows
