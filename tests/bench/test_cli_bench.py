"""`specrt bench` end to end on the tiny fixture bundles: JSON with every documented key, Markdown, PNG."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from specrt.bench.aggregate import ROW_KEYS
from specrt.bench.runner import TOP_KEYS
from specrt.cli.main import main

SMALL = ["--repeats", "1", "--max-new-tokens", "16", "--prompts-per-suite", "1", "--quiet"]
MACHINE_KEYS = ("cpu", "cores_available", "backend", "provider", "threads", "onnxruntime", "torch", "transformers", "date")


def bench(*args):
    result = CliRunner().invoke(main, ["bench", *map(str, args)])
    return result


def check_result(out: dict, suites=("code", "grounded", "open")):
    for key in TOP_KEYS:
        assert key in out, key
    for key in MACHINE_KEYS:
        assert key in out["machine"], key
    assert {r["suite"] for r in out["results"]} == {*suites, "overall"}
    for row in out["results"]:
        if row["method"] == "none":
            continue
        for key in ROW_KEYS:
            assert key in row, key
        for key in ("median", "min", "max", "iqr"):
            assert key in row["speedup"] and key in row["tokens_per_second"]
        assert row["identical"] is True  # greedy: speculative output equals plain output on every prompt
    assert out["verify_cost"]["ratio"][0] == 1.0 and len(out["verify_cost"]["k"]) >= 2
    assert out["memory"]["peak_rss_mb"] > 0


@pytest.mark.slow  # a whole bench run in a real process
def test_bench_cli_subprocess_json_markdown_plot(pair_bundle, tmp_path):
    js, md, png = tmp_path / "out.json", tmp_path / "out.md", tmp_path / "out.png"
    proc = subprocess.run([sys.executable, "-m", "specrt", "bench", str(pair_bundle), *SMALL, "--k", "1,4,auto",
                           "--json", str(js), "--markdown", str(md), "--plot", str(png)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(js.read_text())
    check_result(out)
    labels = {r["label"] for r in out["results"]}
    assert {"plain", "draft k=1", "draft k=4", "draft k=auto", "ngram k=1", "ngram k=4", "ngram k=auto"} <= labels
    draft4 = next(r for r in out["results"] if r["label"] == "draft k=4" and r["suite"] == "overall")
    assert draft4["drafted_tokens"] > 0 and sum(draft4["accepted_histogram"]) == draft4["verify_steps"]
    assert draft4["prediction"] == "formula" and draft4["predicted_speedup"] > 0
    text = md.read_text()
    for needle in ("## Benchmark", "**Machine**", "**Date**", "**Command**", "specrt bench", "### Suite: overall",
                   "Verify cost", "Acceptance per draft position", "| draft k=4 | overall |", "out.png"):
        assert needle in text, needle
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_simulated_acceptance(pair_bundle, tmp_path):
    js = tmp_path / "sim.json"
    small = [a if a != "16" else "40" for a in SMALL]  # 40 new tokens (an option given twice is refused)
    res = bench(pair_bundle, *small, "--suite", "code", "--simulate-acceptance",
                "0.5,1.0", "--k", "1,4", "--json", js, "--plot", tmp_path / "sim.png")
    assert res.exit_code == 0, res.output
    out = json.loads(js.read_text())
    check_result(out, suites=("code",))
    rows = {(r["simulated_acceptance"], r["k"]): r for r in out["results"] if r["method"] == "replay" and r["suite"] == "overall"}
    assert set(rows) == {(0.5, 1), (0.5, 4), (1.0, 1), (1.0, 4)}
    assert rows[(1.0, 4)]["acceptance_rate"] == 1.0 and rows[(1.0, 4)]["cost_ratio"] == 0.0
    assert rows[(1.0, 4)]["predicted_speedup"] == pytest.approx(5.0 / rows[(1.0, 4)]["verify_cost_ratio"])
    # per draft position: all accepted at acceptance 1.0; at 0.5 each position at most the one before, and
    # position 1's accepted steps are the histogram's steps that accepted one or more (the last step of a run
    # may draft fewer than k: only the room left)
    full, half = rows[(1.0, 4)], rows[(0.5, 4)]
    assert full["acceptance_per_position"] == [1.0] * 4
    drafts = full["drafts_per_position"]
    assert drafts[0] == full["verify_steps"] and all(a >= b for a, b in zip(drafts, drafts[1:])) and drafts[3] > 0
    rates, drafts = half["acceptance_per_position"], half["drafts_per_position"]
    assert len(rates) == 4 and all(a >= b for a, b in zip(rates, rates[1:])) and 0 < rates[-1] < rates[0] < 1
    assert round(rates[0] * drafts[0]) == sum(half["accepted_histogram"][1:])


def test_bench_prompts_file_and_peer_hf(pair_bundle, llama_target, llama_draft, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "import os", "suite": "mine"}\n\n{"prompt": "def f(x):"}\n')
    js = tmp_path / "peer.json"
    res = bench(pair_bundle, "--prompts", prompts, *SMALL, "--methods", "draft,ngram", "--k", "2", "--peer", "hf",
                "--target-checkpoint", llama_target, "--draft-checkpoint", llama_draft, "--json", js)
    assert res.exit_code == 0, res.output
    out = json.loads(js.read_text())
    check_result(out, suites=("mine", "custom"))
    peer = out["peer"]
    assert peer["torch_threads"] == peer["ort_threads"] == out["machine"]["threads"]
    got = {(r["peer"], r["k"]) for r in peer["results"] if r["suite"] == "overall"}
    assert got == {("plain", 0), ("assisted", 2), ("lookup", 2)}
    for r in peer["results"]:
        assert r["token_agreement"] == pytest.approx(1.0)  # same checkpoint, fp32, greedy
        assert r["ratio_ours_over_theirs"] > 0


@pytest.mark.parametrize("args, message", [
    (["--k", "99"], "outside [1, 8]"),
    (["--methods", "medusa"], "not available"),
    (["--peer", "hf"], "--target-checkpoint"),
    (["--simulate-acceptance", "1.5"], "[0, 1]"),
    (["--suite", "poetry"], "unknown suite"),
])
def test_bench_bad_input_is_a_one_line_error(pair_bundle, args, message):
    res = bench(pair_bundle, *SMALL, *args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_bench_needs_a_bundle():
    res = bench("--quiet")
    assert res.exit_code == 2 and "BUNDLE" in res.output
