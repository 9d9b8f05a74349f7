"""From timed runs to result rows: one row per (configuration, suite), plus suite "overall".

Speedup of a run = its tokens/s over the mean tokens/s of the two plain runs next to it (A B A B ...).
Per repeat, a suite's number is the geometric mean over its prompts, and "overall" is the geometric mean
over suites; the reported median / min / max / IQR are over repeats. Counters (drafted, accepted,
histogram, seconds) are pooled over every timed run of the row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specrt.bench import predict


@dataclasses.dataclass(frozen=True)
class Config:
    method: str  # draft | ngram | medusa | replay
    k: int | str  # int or "auto"
    acceptance: float | None = None  # the simulated acceptance (replay only)

    @property
    def label(self) -> str:
        sim = f" a={self.acceptance:g}" if self.acceptance is not None else ""
        return f"{self.method}{sim} k={self.k}"


@dataclasses.dataclass
class Sample:
    """One timed run of a configuration and the plain runs next to it."""

    suite: str
    prompt: int
    repeat: int
    run: Any  # measure.Run
    plain_decode_tps: float
    plain_e2e_tps: float
    identical: bool | None  # greedy: same tokens as the plain run; None when sampling


def _per_repeat(samples: list[Sample], value) -> list[float]:
    """Per repeat: geometric mean over suites of (geometric mean over the suite's prompts)."""
    out = []
    for r in sorted({s.repeat for s in samples}):
        by_suite: dict[str, list[float]] = {}
        for s in samples:
            if s.repeat == r:
                by_suite.setdefault(s.suite, []).append(value(s))
        out.append(predict.geomean([predict.geomean(v) for v in by_suite.values()]))
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def plain_row(suite: str, plain_runs: list[tuple[str, int, Any]]) -> dict[str, Any]:
    """The baseline row: plain_runs = (suite, repeat, Run) of every timed plain run."""
    samples = [Sample(s, 0, r, run, 0.0, 0.0, True) for s, r, run in plain_runs]
    return {
        "method": "none", "k": 0, "simulated_acceptance": None, "suite": suite, "label": "plain",
        "runs": len(samples),
        "tokens_per_second": predict.spread(_per_repeat(samples, lambda s: s.run.stats.tokens_per_second)),
        "decode_tokens_per_second": predict.spread(_per_repeat(samples, lambda s: s.run.stats.decode_tokens_per_second)),
        "speedup": predict.spread([1.0]), "speedup_end_to_end": predict.spread([1.0]),
        "identical": True,
    }


def plain_seconds_per_token(plain_runs: list[tuple[str, int, Any]]) -> float:
    tokens = sum(max(run.stats.new_tokens - 1, 0) for _, _, run in plain_runs)
    seconds = sum(run.stats.elapsed_s - run.stats.prefill_seconds for _, _, run in plain_runs)
    return seconds / tokens if tokens else 0.0


def config_row(config: Config, suite: str, samples: list[Sample], verify: dict[str, Any],
               plain_spt: float) -> dict[str, Any]:
    """All numbers of one configuration on one suite (or "overall")."""
    runs = [s.run for s in samples]
    st = [r.stats for r in runs]
    steps = [step for r in runs for step in r.steps]  # (k, drafted, accepted) per speculative step
    drafted = sum(x.drafted_tokens for x in st)
    accepted = sum(x.accepted_tokens for x in st)
    verify_steps = sum(x.verify_steps for x in st)
    spec_steps = len(steps)
    rejections = predict.count_rejections([(d, a) for _, d, a in steps])
    per_position, position_drafts = predict.acceptance_per_position([(d, a) for _, d, a in steps])
    histogram: list[int] = []
    for x in st:
        histogram.extend([0] * (len(x.accepted_histogram) - len(histogram)))
        for j, count in enumerate(x.accepted_histogram):
            histogram[j] += count
    draft_s = sum(x.draft_seconds for x in st)
    verify_s = sum(x.verify_seconds for x in st)
    decode_s = sum(x.elapsed_s - x.prefill_seconds for x in st)
    a_rate = _ratio(accepted, drafted)
    a_token = predict.alpha(accepted, rejections)
    tokens_per_step = 1.0 + _ratio(accepted, verify_steps)  # mean accepted tokens (bonus included)
    drafted_per_step = _ratio(drafted, verify_steps)
    c_measured = predict.cost_ratio(draft_s, drafted, plain_spt)
    c = 0.0 if config.method == "replay" else c_measured  # replay: zero draft cost by construction
    if steps and len(steps) == verify_steps:  # every step recorded: the mean cost of the passes made
        v_ratio = predict.mean_verify_ratio(verify["k"], verify["ratio"], [d for _, d, _ in steps])
    else:
        v_ratio = predict.interpolate(verify["k"], verify["ratio"], drafted_per_step)
    uniform = config.k != "auto" and all(d == k for k, d, _ in steps)
    from_tokens = predict.speedup_from_tokens(tokens_per_step, drafted_per_step, c, v_ratio) if verify_steps else 0.0
    if uniform and spec_steps:
        k = int(config.k)
        v_ratio = predict.interpolate(verify["k"], verify["ratio"], k)
        predicted = predict.predicted_speedup(a_token, k, c, v_ratio)
    else:
        predicted = from_tokens
    speedup = predict.spread(_per_repeat(samples, lambda s: _ratio(s.run.stats.decode_tokens_per_second, s.plain_decode_tps)))
    idents = [s.identical for s in samples]
    return {
        "method": config.method, "k": config.k, "simulated_acceptance": config.acceptance, "suite": suite,
        "label": config.label, "runs": len(samples),
        "tokens_per_second": predict.spread(_per_repeat(samples, lambda s: s.run.stats.tokens_per_second)),
        "decode_tokens_per_second": predict.spread(_per_repeat(samples, lambda s: s.run.stats.decode_tokens_per_second)),
        "speedup": speedup,
        "speedup_end_to_end": predict.spread(_per_repeat(samples, lambda s: _ratio(s.run.stats.tokens_per_second, s.plain_e2e_tps))),
        "acceptance_rate": a_rate, "acceptance_per_token": a_token,
        "mean_accepted_tokens": tokens_per_step, "mean_drafted_per_step": drafted_per_step,
        "accepted_histogram": histogram, "verify_steps": verify_steps, "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_per_position": per_position, "drafts_per_position": position_drafts,
        "time_split": {"draft_seconds": draft_s, "verify_seconds": verify_s, "decode_seconds": decode_s,
                       "draft_fraction": _ratio(draft_s, decode_s), "verify_fraction": _ratio(verify_s, decode_s),
                       "other_fraction": _ratio(max(decode_s - draft_s - verify_s, 0.0), decode_s)},
        "draft_seconds_per_call": _ratio(draft_s, sum(x.draft_calls for x in st)),
        "cost_ratio": c, "cost_ratio_measured": c_measured, "verify_cost_ratio": v_ratio,
        "predicted_speedup": predicted, "predicted_speedup_from_measured_tokens": from_tokens,
        "prediction": "formula" if uniform else "measured_tokens",
        "efficiency": predict.efficiency(speedup["median"], predicted),
        "identical": None if any(i is None for i in idents) else all(idents),
        "identical_prompts": f"{sum(1 for i in idents if i)}/{len(idents)}" if None not in idents else "n/a",
    }


def build_rows(configs: list[Config], suites: list[str], samples: dict[Config, list[Sample]],
               plain_runs: list[tuple[str, int, Any]], verify: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for suite in [*suites, "overall"]:
        pr = plain_runs if suite == "overall" else [p for p in plain_runs if p[0] == suite]
        rows.append(plain_row(suite, pr))
        spt = plain_seconds_per_token(pr)
        for config in configs:
            ss = samples[config] if suite == "overall" else [s for s in samples[config] if s.suite == suite]
            rows.append(config_row(config, suite, ss, verify, spt))
    return rows


ROW_KEYS = ("method", "k", "simulated_acceptance", "suite", "label", "runs", "tokens_per_second",
            "decode_tokens_per_second", "speedup", "speedup_end_to_end", "acceptance_rate", "acceptance_per_token",
            "mean_accepted_tokens", "mean_drafted_per_step", "accepted_histogram", "acceptance_per_position",
            "drafts_per_position", "time_split", "cost_ratio", "cost_ratio_measured", "verify_cost_ratio", "predicted_speedup", "efficiency", "identical")
