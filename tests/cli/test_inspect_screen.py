"""`specrt inspect` (issue 15): a tampered bundle is described with its failed checks marked (exit 2),
the memory plan of a CPU bundle is a CPU plan, a larger --max-seq-len is commented, 80 columns suffice."""

import json
import shutil

from helpers import run_cli


def specrt(*args, columns=80):
    """In-process (tests/helpers.py run_cli) with the terminal width set through COLUMNS."""
    return run_cli(*args, env={"COLUMNS": str(columns)})


def test_tampered_bundle_is_described_with_failed_checks(pair_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(pair_bundle, bundle)
    data = bundle / "draft" / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    proc = specrt("inspect", bundle)
    assert proc.returncode == 2
    assert "FAILED draft/model.onnx.data: sha256 differs from the manifest (corrupted or modified)" in proc.stdout
    assert "checksums FAILED (1)" in proc.stdout and "target" in proc.stdout and "draft" in proc.stdout
    assert proc.stderr.startswith(f"error: bundle {bundle} failed 1 check(s) (marked FAILED)")
    proc = specrt("inspect", bundle, "--json")
    assert proc.returncode == 2
    out = json.loads(proc.stdout)
    assert out["failed_checks"] == ["draft/model.onnx.data: sha256 differs from the manifest (corrupted or modified)"]
    # refused where that file would run (the portable graph); the CPU runner opens only the fused graph
    proc = specrt("generate", bundle, "--prompt", "x", "--backend", "ort-portable")
    assert proc.returncode == 2 and "draft/model.onnx.data has sha256" in proc.stderr


def test_sound_bundle_fits_80_columns(pair_bundle):
    proc = specrt("inspect", pair_bundle)
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout and all(len(line) <= 80 for line in proc.stdout.splitlines()), proc.stdout
    assert "checksums ok" in proc.stdout and "FAILED" not in proc.stdout
    assert "Llama" in proc.stdout and "fp32" in proc.stdout


def test_memory_plan_of_a_cpu_bundle(pair_bundle):
    proc = specrt("inspect", pair_bundle, "--memory", "--json")
    assert proc.returncode == 0, proc.stderr
    mem = json.loads(proc.stdout)["memory"]
    assert {r["device"] for r in mem["rows"]} == {"cpu"} and all(r["workspace_bytes"] == 0 for r in mem["rows"])
    proc = specrt("inspect", pair_bundle, "--memory", "--max-seq-len", 4096)
    assert proc.returncode == 0
    assert "cuda:0" not in proc.stdout and "note: CPU plan (ONNX Runtime)" in proc.stdout
    assert ("note: --max-seq-len 4096 is above the bundle's max_seq_len 128: this plans a bundle recompiled with "
            "`specrt compile --max-seq-len 4096`") in proc.stdout
    assert "…" not in proc.stdout
