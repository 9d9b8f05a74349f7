"""scripts/load_test.py against the test server: a bounded run, JSON and table output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "load_test.py"


def run(server, *extra):
    out = subprocess.run([sys.executable, str(SCRIPT), "--url", server.url, "--concurrency", "1,4", "--requests",
                          "6", "--max-tokens", "4", *extra], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def test_load_script_json_streaming(server):
    report = json.loads(run(server, "--stream", "--json", "--num-speculative-tokens", "2"))
    assert report["model"] == "tiny" and [r["concurrency"] for r in report["levels"]] == [1, 4]
    for row in report["levels"]:
        assert row["ok"] == row["requests"] == 6 and row["errors"] == {}
        assert row["requests_per_s"] > 0 and row["output_tokens_per_s"] > 0
        assert 0 < row["ttft_p50_s"] <= row["latency_p99_s"]
        assert row["latency_p50_s"] <= row["latency_p90_s"] <= row["latency_p99_s"]


def test_load_script_table_chat(server):
    table = run(server, "--chat")
    assert "req/s" in table and "p99 ms" in table and len(table.strip().splitlines()) == 4
