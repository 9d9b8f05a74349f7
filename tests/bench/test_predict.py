"""The benchmark's formulas as pure functions."""

import math

import pytest

from specrt.bench import predict


def test_expected_tokens():
    assert predict.expected_tokens(0.0, 4) == 1.0  # nothing accepted: the bonus/recovered token only
    assert predict.expected_tokens(1.0, 4) == 5.0  # everything accepted: k drafts + the bonus token
    assert predict.expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert predict.expected_tokens(0.8, 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    with pytest.raises(ValueError):
        predict.expected_tokens(1.5, 2)


def test_predicted_speedup_matches_leviathan():
    a, k, c = 0.7, 4, 0.05
    ideal = (1 - a ** (k + 1)) / ((1 - a) * (k * c + 1))
    assert predict.predicted_speedup(a, k, c) == pytest.approx(ideal)
    # the measured verify cost replaces the 1
    assert predict.predicted_speedup(a, k, c, 1.3) == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1.3)))
    # zero draft cost, free verify: the speedup is the tokens per step
    assert predict.predicted_speedup(0.9, 8, 0.0, 1.0) == pytest.approx(predict.expected_tokens(0.9, 8))


def test_speedup_from_measured_tokens_and_efficiency():
    assert predict.speedup_from_tokens(2.5, 3.0, 0.1, 1.2) == pytest.approx(2.5 / 1.5)
    assert predict.efficiency(1.5, 2.0) == 0.75
    assert predict.efficiency(1.0, 0.0) == 0.0
    with pytest.raises(ValueError):
        predict.speedup_from_tokens(1.0, 0.0, 0.0, 0.0)


def test_alpha_is_the_per_token_acceptance():
    steps = [(4, 4), (4, 1), (4, 0), (4, 4), (2, 2)]  # (drafted, accepted)
    rej = predict.count_rejections(steps)
    assert rej == 2
    assert predict.alpha(11, rej) == pytest.approx(11 / 13)
    assert predict.alpha(0, 0) == 0.0


def test_cost_ratio_and_interpolation():
    assert predict.cost_ratio(0.2, 100, 0.01) == pytest.approx(0.2)  # 2 ms per draft token / 10 ms per step
    assert predict.cost_ratio(0.2, 0, 0.01) == 0.0
    xs, ys = [0, 1, 2, 4], [1.0, 1.1, 1.2, 1.6]
    assert predict.interpolate(xs, ys, 3) == pytest.approx(1.4)
    assert predict.interpolate(xs, ys, 1.5) == pytest.approx(1.15)
    assert predict.interpolate(xs, ys, 9) == 1.6 and predict.interpolate(xs, ys, -1) == 1.0


def test_spread_and_geomean():
    s = predict.spread([3.0, 1.0, 2.0, 10.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 10.0 and s["n"] == 4 and s["iqr"] > 0
    assert predict.spread([2.0])["iqr"] == 0.0
    assert predict.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert predict.geomean([]) == 0.0 and predict.geomean([1.0, 0.0]) == 0.0
    assert math.isclose(predict.geomean([2.0, 2.0, 2.0]), 2.0)


def test_varying_draft_lengths_are_costed_per_pass():
    """Adaptive k mixes plain steps and long drafts: the verify cost is the mean over the passes made, not V at
    the mean k (here V(2) = 1.17 while half plain steps, half k = 4 passes cost (1 + 1.26) / 2 = 1.13)."""
    from types import SimpleNamespace

    from specrt.bench.aggregate import Config, Sample, config_row
    from specrt.runtime.stats import GenerationStats

    xs, ratios = [0, 1, 2, 4, 8], [1.0, 1.11, 1.17, 1.26, 1.75]
    assert predict.mean_verify_ratio(xs, ratios, [0, 4, 0, 4]) == pytest.approx(1.13)
    assert predict.mean_verify_ratio(xs, ratios, [3]) == pytest.approx(predict.interpolate(xs, ratios, 3))
    steps = [(0, 0, 0), (4, 4, 4), (0, 0, 0), (4, 4, 2)]
    stats = GenerationStats(new_tokens=10, elapsed_s=0.02, draft_seconds=0.004, drafted_tokens=8,
                            accepted_tokens=6, verify_steps=4, draft_calls=8)
    run = SimpleNamespace(stats=stats, steps=steps)
    row = config_row(Config("draft", "auto"), "code", [Sample("code", 0, 0, run, 300.0, 300.0, True)],
                     {"k": xs, "ratio": ratios}, plain_spt=0.002)
    c = (0.004 / 8) / 0.002
    assert row["verify_cost_ratio"] == pytest.approx(1.13) and row["prediction"] == "measured_tokens"
    assert row["predicted_speedup"] == pytest.approx((1 + 6 / 4) / (2 * c + 1.13))


def test_each_timed_verify_pass_follows_one_of_the_same_shape(pair_generator, monkeypatch):
    """V(k) is a steady-state cost: a runner rebinds its buffers when the call shape changes, which a fixed
    k does not pay every step; the curve runs an untimed pass of the same shape before each timed one."""
    from specrt.bench.measure import verify_curve

    target = pair_generator.target
    sizes: list[int] = []
    real = target.forward
    monkeypatch.setattr(target, "forward", lambda ids: sizes.append(int(ids.size)) or real(ids))
    curve = verify_curve(target, past_len=20, ks=[1, 2, 4], reps=2)
    passes = sizes[1:]  # after the one prefill call of 20 positions
    assert sizes[0] == 20 and len(passes) == 3 * 4 * 2  # 3 rounds (1 warm-up) x k in 0,1,2,4 x 2 passes
    assert passes[0::2] == passes[1::2] == [1, 2, 3, 5] * 3
    assert curve["k"] == [0, 1, 2, 4] and curve["ratio"][0] == 1.0 and all(s > 0 for s in curve["seconds"])


def test_acceptance_per_position_counts_the_steps_that_reached_each_position():
    # (drafted, accepted): a step that drafted 1 token does not count at positions 2..
    rates, drafts = predict.acceptance_per_position([(3, 3), (3, 1), (3, 0), (1, 1), (0, 0)])
    assert drafts == [4, 3, 3]
    assert rates == [3 / 4, 1 / 3, 1 / 3]
    assert predict.acceptance_per_position([]) == ([], [])
