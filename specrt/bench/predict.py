"""The benchmark's formulas, as pure functions of measured numbers.

With a = per-token acceptance probability, k = draft length, c = cost ratio (one draft token / one
target decode step) and V(k) = seconds of a verify pass over k + 1 tokens (V(0) = a plain decode step):

    tokens per step      E(k) = (1 - a^(k+1)) / (1 - a)                    (k + 1 when a = 1)
    predicted speedup    S(k) = E(k) / (k * c + V(k) / V(0))
    efficiency                = measured speedup / predicted speedup

Where the draft length varies per step (n-gram misses, adaptive k), E is the measured mean accepted
tokens per step, k the measured mean drafted tokens per step, and V(k)/V(0) the mean over steps of V(d)/V(0)
for the pass each step made (d drafted, d + 1 tokens verified; V interpolated between measured k): the cost
of the passes actually made (V at the mean k misjudges a mix of plain steps and long drafts).

Two acceptance numbers are reported: `acceptance_rate` = accepted / drafted (vLLM's convention) and the
per-token acceptance `alpha` = accepted / (accepted + rejections), a rejection being a step that stopped
before its last draft. `alpha` is the maximum-likelihood estimate of the `a` in E(k) when every token is
accepted independently with probability a; accepted / drafted is smaller than a for k > 1.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence


def expected_tokens(a: float, k: float) -> float:
    """E(k) = (1 - a^(k+1)) / (1 - a): tokens emitted per verify step (accepted drafts + 1)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {a}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def predicted_speedup(a: float, k: float, c: float, verify_ratio: float = 1.0) -> float:
    """(1 - a^(k+1)) / ((1 - a) * (k*c + V(k)/V(0))); verify_ratio = V(k)/V(0) (1 = the ideal model)."""
    return speedup_from_tokens(expected_tokens(a, k), k, c, verify_ratio)


def speedup_from_tokens(tokens_per_step: float, drafted_per_step: float, c: float, verify_ratio: float) -> float:
    """E / (k̄ * c + V(k̄)/V(0)) with E and k̄ measured (draft length varying per step)."""
    cost = drafted_per_step * c + verify_ratio
    if cost <= 0:
        raise ValueError(f"step cost must be positive, got k*c + V = {cost}")
    return tokens_per_step / cost


def efficiency(measured: float, predicted: float) -> float:
    """measured / predicted speedup: the fraction of the predicted gain the runtime delivers."""
    return measured / predicted if predicted > 0 else 0.0


def alpha(accepted: int, rejections: int) -> float:
    """Per-token acceptance: accepted / (accepted + rejections); 0 with no evidence."""
    total = accepted + rejections
    return accepted / total if total else 0.0


def count_rejections(steps: Sequence[tuple[int, int]]) -> int:
    """Steps that stopped at a rejected draft, from per-step (drafted, accepted) pairs."""
    return sum(1 for drafted, accepted in steps if accepted < drafted)


def acceptance_per_position(steps: Sequence[tuple[int, int]]) -> tuple[list[float], list[int]]:
    """Acceptance at each draft position j = 1, 2, ...: of the verify steps that drafted at least j tokens, the
    share that accepted at least j (the model card's and vLLM's per-position rate; with a fixed k it is
    accepted-at-j / drafts). Returns (rates, drafts) with drafts[j-1] = the steps that drafted position j."""
    longest = max((d for d, _ in steps), default=0)
    drafts = [sum(1 for d, _ in steps if d >= j) for j in range(1, longest + 1)]
    accepted = [sum(1 for d, a in steps if d >= j and a >= j) for j in range(1, longest + 1)]
    return [a / n if n else 0.0 for a, n in zip(accepted, drafts)], drafts


def cost_ratio(draft_seconds: float, drafted_tokens: int, plain_seconds_per_token: float) -> float:
    """c = seconds of drafting per drafted token / seconds per token of a plain decode step."""
    if drafted_tokens <= 0 or plain_seconds_per_token <= 0:
        return 0.0
    return (draft_seconds / drafted_tokens) / plain_seconds_per_token


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear y(x) through sorted xs; clamped to the end values outside [xs[0], xs[-1]]."""
    if not xs:
        raise ValueError("no points to interpolate")
    if x <= xs[0]:
        return float(ys[0])
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0)) if x1 != x0 else float(y1)
    return float(ys[-1])


def mean_verify_ratio(xs: Sequence[float], ratios: Sequence[float], drafted: Sequence[int]) -> float:
    """Mean of V(d)/V(0) over steps that drafted d tokens each (V interpolated through (xs, ratios))."""
    if not drafted:
        raise ValueError("no steps")
    by_d: dict[int, int] = {}
    for d in drafted:
        by_d[int(d)] = by_d.get(int(d), 0) + 1
    return sum(n * interpolate(xs, ratios, d) for d, n in by_d.items()) / len(drafted)


def spread(values: Sequence[float]) -> dict[str, float]:
    """median, min, max and interquartile range of repeated measurements."""
    vals = sorted(float(v) for v in values)
    if not vals:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "iqr": 0.0, "n": 0}
    if len(vals) >= 2:
        q = statistics.quantiles(vals, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = 0.0
    return {"median": statistics.median(vals), "min": vals[0], "max": vals[-1], "iqr": iqr, "n": len(vals)}


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive values (0 if any is <= 0 or there are none)."""
    vals = [float(v) for v in values]
    if not vals or any(v <= 0 for v in vals):
        return 0.0
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
