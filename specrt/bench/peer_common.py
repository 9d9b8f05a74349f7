"""What every peer library in `specrt bench --peer` shares: the runnable-peer contract, the summary rows
(their tokens/s beside ours, token agreement) and the ratio line.

A `Peer` (onnxruntime-genai, llama.cpp) is prepared before anything is measured (builds, loads), then
runs inside the benchmark's own loop, after our configurations on the same prompt, so both sides see the
same machine load. Throughput is end to end (prefill included) on both sides.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specrt.bench import predict


@dataclasses.dataclass(frozen=True)
class PeerConfig:
    kind: str  # the peer's own name for the method: plain | draft | lookup | assisted | ngram
    k: int | str  # 0 for plain; int or "auto"
    ours: str  # our matching method: none | draft | ngram

    @property
    def label(self) -> str:
        return self.kind if self.kind == "plain" else f"{self.kind} k={self.k}"


PLAIN = PeerConfig("plain", 0, "none")


@dataclasses.dataclass
class PeerRun:
    token_ids: list[int]  # new tokens
    seconds: float  # end to end
    drafted: int = 0  # the peer's own counters, where it reports them
    accepted: int = 0


class Peer:
    """The contract: `configs`, `generate(prompt_ids, config, max_new_tokens)`, `describe()`, `close()`."""

    name = "peer"

    def configs(self) -> list[PeerConfig]:
        raise NotImplementedError

    def generate(self, prompt_ids: list[int], config: PeerConfig, max_new_tokens: int | None = None) -> PeerRun:
        """Greedy, end to end; `max_new_tokens` None = the benchmark's budget."""
        raise NotImplementedError

    def first_token_seconds(self, prompt_ids: list[int]) -> float:
        return self.generate(prompt_ids, PLAIN, max_new_tokens=1).seconds

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def spec_ks(settings, allow_auto: bool = True) -> list[int | str]:
    return [k for k in settings.ks if allow_auto or k != "auto"]


def agreement(ours: list[int], theirs: list[int]) -> float:
    """Fraction of positions with the same token (the longer output's length is the denominator)."""
    n = max(len(ours), len(theirs))
    return sum(1 for a, b in zip(ours, theirs) if a == b) / n if n else 1.0


def per_repeat(samples: list[tuple[str, int, float]]) -> list[float]:
    """samples = (suite, repeat, tokens/s); per repeat the geometric mean over suites of the suites' means."""
    out = []
    for r in sorted({s[1] for s in samples}):
        by_suite: dict[str, list[float]] = {}
        for suite, rr, v in samples:
            if rr == r:
                by_suite.setdefault(suite, []).append(v)
        out.append(predict.geomean([predict.geomean(v) for v in by_suite.values()]))
    return out


def mean_over(values: list[float], prompts, suite: str) -> float | None:
    picked = [v for v, p in zip(values, prompts) if suite == "overall" or p.suite == suite]
    return sum(picked) / len(picked) if picked else None


def result_rows(configs: list[PeerConfig], timings: dict[PeerConfig, list[tuple[str, int, float]]],
                agree: dict[PeerConfig, list[float]], prompts, rows: list[dict[str, Any]],
                counters: dict[PeerConfig, list[int]] | None = None) -> list[dict[str, Any]]:
    """One row per (peer config, suite and "overall"): their tokens/s, ours for the matching method, ratio."""
    ours_by = {(row["method"], row["k"], row["suite"]): row for row in rows}
    suites = list(dict.fromkeys(p.suite for p in prompts))
    out = []
    for c in configs:
        for suite in [*suites, "overall"]:
            tps = predict.spread(per_repeat([s for s in timings[c] if suite == "overall" or s[0] == suite]))
            ours = ours_by.get((c.ours, 0 if c.kind == "plain" else c.k, suite))
            ours_tps = ours["tokens_per_second"]["median"] if ours else None
            row = {"peer": c.kind, "k": c.k, "suite": suite, "ours_method": c.ours, "tokens_per_second": tps,
                   "ours_tokens_per_second": ours_tps,
                   "ratio_ours_over_theirs": (ours_tps / tps["median"]) if ours_tps and tps["median"] else None,
                   "token_agreement": mean_over(agree[c], prompts, suite)}
            if counters and suite == "overall" and counters[c][0]:
                row["acceptance_rate"] = counters[c][1] / counters[c][0]
            out.append(row)
    return out


def ratios(results: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary line, overall and end to end: our plain / their plain, and per speculative peer
    configuration our best speculative row at the same k (any method) / theirs."""
    overall = [r for r in results if r["suite"] == "overall"]
    plain = next((r for r in overall if r["peer"] == "plain"), None)
    ours_plain = next((r for r in rows if r["method"] == "none" and r["suite"] == "overall"), None)
    out: dict[str, Any] = {"plain": None, "speculative": []}
    if plain and ours_plain:
        theirs, ours = plain["tokens_per_second"]["median"], ours_plain["tokens_per_second"]["median"]
        out["plain"] = {"theirs": theirs, "ours": ours, "ratio": ours / theirs if theirs else None}
    for r in overall:
        if r["peer"] == "plain":
            continue
        candidates = [row for row in rows if row["suite"] == "overall" and row["method"] not in ("none", "replay")
                      and row["k"] == r["k"]]
        if not candidates:
            continue
        best = max(candidates, key=lambda row: row["tokens_per_second"]["median"])
        theirs, ours = r["tokens_per_second"]["median"], best["tokens_per_second"]["median"]
        out["speculative"].append({"peer": r["peer"], "k": r["k"], "theirs": theirs, "ours_best": best["label"],
                                   "ours": ours, "ratio": ours / theirs if theirs else None})
    return out


def ratio_line(name: str, r: dict[str, Any]) -> str:
    """'ours / onnxruntime-genai, end to end: plain / plain 2.28x; draft k=2 / its draft k=2 2.95x; ...'
    (ours first: our plain row, then our fastest speculative row at the peer configuration's k)."""
    parts = []
    if r.get("plain") and r["plain"]["ratio"] is not None:
        parts.append(f"plain / plain {r['plain']['ratio']:.2f}x")
    for s in r.get("speculative", []):
        if s["ratio"] is not None:
            parts.append(f"{s['ours_best']} / its {s['peer']} k={s['k']} {s['ratio']:.2f}x")
    return f"ours / {name}, end to end: " + ("; ".join(parts) if parts else "n/a")
