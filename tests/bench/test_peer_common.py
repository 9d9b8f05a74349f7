"""The peer summary: their rows beside ours, the ratio line (our fastest speculative row at the peer's k)."""

import pytest

from specrt.bench.peer_common import PeerConfig, agreement, ratio_line, ratios, result_rows
from specrt.bench.suites import Prompt


def ours(method, k, suite, tps, label=None):
    return {"method": method, "k": k, "suite": suite, "label": label or ("plain" if method == "none" else f"{method} k={k}"),
            "tokens_per_second": {"median": tps}}


ROWS = [ours("none", 0, "overall", 100.0), ours("draft", 2, "overall", 180.0), ours("ngram", 2, "overall", 150.0),
        ours("draft", 4, "overall", 160.0), ours("ngram", 4, "overall", 210.0), ours("none", 0, "code", 100.0),
        ours("draft", 2, "code", 180.0), ours("ngram", 2, "code", 150.0)]


def test_rows_and_ratios():
    prompts = [Prompt("code", "a"), Prompt("code", "b")]
    configs = [PeerConfig("plain", 0, "none"), PeerConfig("draft", 2, "draft"), PeerConfig("ngram", 2, "ngram"),
               PeerConfig("draft", 4, "draft")]
    timings = {c: [("code", 0, v), ("code", 0, v)] for c, v in zip(configs, (50.0, 90.0, 60.0, 80.0))}
    agree = {c: [1.0, 0.5] for c in configs}
    counters = {c: [10, 4] for c in configs}
    results = result_rows(configs, timings, agree, prompts, ROWS, counters)
    overall = {(r["peer"], r["k"]): r for r in results if r["suite"] == "overall"}
    assert overall[("plain", 0)]["ratio_ours_over_theirs"] == pytest.approx(2.0)
    assert overall[("draft", 2)]["ours_tokens_per_second"] == 180.0  # same method, same k
    assert overall[("ngram", 2)]["ratio_ours_over_theirs"] == pytest.approx(2.5)
    assert overall[("draft", 2)]["token_agreement"] == 0.75 and overall[("draft", 2)]["acceptance_rate"] == pytest.approx(0.4)
    assert {r["suite"] for r in results} == {"code", "overall"}
    r = ratios(results, ROWS)
    assert r["plain"]["ratio"] == pytest.approx(2.0)
    spec = {(s["peer"], s["k"]): s for s in r["speculative"]}
    assert spec[("draft", 2)]["ours_best"] == "draft k=2" and spec[("draft", 2)]["ratio"] == pytest.approx(2.0)
    assert spec[("draft", 4)]["ours_best"] == "ngram k=4"  # our fastest method at k=4, whatever it is
    assert spec[("draft", 4)]["ratio"] == pytest.approx(210.0 / 80.0)
    line = ratio_line("onnxruntime-genai", r)
    assert line.startswith("ours / onnxruntime-genai, end to end: plain / plain 2.00x; draft k=2 / its draft k=2 2.00x")
    assert "ngram k=4 / its draft k=4 2.63x" in line


def test_agreement_counts_the_longer_output():
    assert agreement([1, 2, 3, 4], [1, 2, 9]) == 0.5
    assert agreement([], []) == 1.0
