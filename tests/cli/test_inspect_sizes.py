"""`compile` prints the bundle's size; `inspect` lists every file with its size and shows an int4 model's
weights as int4 (not the fp32 of its activations)."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli


def specrt(*args, columns=120):
    """In-process (tests/helpers.py run_cli) with the terminal width set through COLUMNS."""
    return run_cli(*args, env={"COLUMNS": str(columns)})


@pytest.mark.slow
def test_int4_bundle_size_and_dtype(llama_target, tmp_path):
    out = tmp_path / "q4"
    proc = specrt("compile", "--target", llama_target, "-o", out, "--max-seq-len", 64, "--max-draft-tokens", 2,
                  "--quantize", "int4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    on_disk = {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*")
               if p.is_file() and p.name != "manifest.json"}
    total = sum(on_disk.values())
    from specrt.cli.describe import human_size

    assert f"{human_size(total)} in {len(on_disk)} files" in proc.stdout, proc.stdout
    summary = json.loads(specrt("inspect", out, "--json").stdout)
    assert summary["file_sizes"] == dict(sorted(on_disk.items(), key=lambda kv: (-kv[1], kv[0])))
    for columns, cell in ((120, "int4 (fp32 act.)"), (80, "int4")):
        text = specrt("inspect", out, columns=columns).stdout
        row = next(line for line in text.splitlines() if "target" in line and "Llama" in line)
        assert cell in row and "float32" not in row and "fp32 " not in row.replace("(fp32 act.)", ""), row
        biggest = next(iter(summary["file_sizes"]))
        assert any(line.split()[:1] == [biggest] for line in text.splitlines()), text


@pytest.mark.slow
def test_self_int4_draft_reuses_the_target_int4_files(llama_target, tmp_path):
    """`--quantize int4 --draft self:int4`: the draft runs the target's int4 graphs (the same files), so the
    bundle is no larger than the int4 bundle without a draft, and speculation still equals plain decoding."""
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime import load

    sizes = {}
    for name, extra in (("q4", []), ("q4self", ["--draft", "self:int4"])):
        proc = specrt("compile", "--target", llama_target, "-o", tmp_path / name, "--max-seq-len", 64,
                      "--max-draft-tokens", 2, "--quantize", "int4", *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        sizes[name] = sum(p.stat().st_size for p in (tmp_path / name).rglob("*")
                          if p.is_file() and p.name != "manifest.json")
    assert sizes["q4self"] == sizes["q4"]
    m = read_manifest(tmp_path / "q4self", verify_checksums=True)
    draft, target = m.models["draft"], m.models["target"]
    assert draft.self_draft and draft.quantization.graphs == target.quantization.graphs
    assert not list((tmp_path / "q4self").glob("draft/*.onnx*"))
    gen = load(tmp_path / "q4self", backend="ort")
    plain = gen.generate("def main(", 16, method="none").token_ids
    spec = gen.generate("def main(", 16, method="draft", num_speculative_tokens=2)
    assert spec.token_ids == plain and spec.stats.drafted_tokens > 0
    assert spec.stats.accepted_tokens == spec.stats.drafted_tokens or spec.stats.acceptance_rate > 0.5
