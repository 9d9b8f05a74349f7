"""Lean quantized bundles (compiler/lean.py): `--quantize int4 --draft self:int4` keeps only the int4 fused graph
ONNX Runtime runs on the CPU (validated like every graph before the others are dropped); the same model compiled
with `--keep-fp32 --ort-graph both` keeps every graph and decodes to the same tokens; whatever needs a graph left
out refuses in one line naming the compile option."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli
from specrt.bundle.manifest import Manifest, read_manifest
from specrt.core.errors import BundleError
from specrt.runtime.generator import load

PROMPT = "def main(args):\n    "


def test_lean_bundle_keeps_only_the_graph_ort_runs(lean_int4_bundle, int4_self8_bundle):
    lean, full = read_manifest(lean_int4_bundle), read_manifest(int4_self8_bundle)
    graphs = sorted(rel for rel in lean.files if rel.endswith(".onnx"))
    assert graphs == ["target/model.fused.int4.onnx"]  # the self draft shares it
    for role in ("target", "draft"):
        assert set(lean.models[role].omitted) == {"portable", "fused", "quantized.portable"}
        assert lean.models[role].quantization.graphs["fused"].validation is not None  # validated before dropping
    assert not full.models["target"].omitted
    assert {"target/model.onnx", "target/model.fused.onnx", "target/model.int4.onnx"} <= set(full.files)
    size = sum(f.size for f in lean.files.values())
    fp32_weights = full.files["target/model.onnx.data"].size
    assert size < fp32_weights  # smaller than one fp32 copy of the weights
    on_disk = sum(p.stat().st_size for p in lean_int4_bundle.rglob("*") if p.is_file())
    assert on_disk == size + (lean_int4_bundle / "manifest.json").stat().st_size  # nothing unlisted left behind
    again = Manifest.from_dict(lean.to_dict(), lean.root)
    assert again.models["target"].omitted == lean.models["target"].omitted


@pytest.mark.parametrize("method", ["none", "ngram", "draft"])
def test_lean_bundle_generates_what_the_full_one_does(lean_int4_bundle, int4_self8_bundle, method):
    ref = load(int4_self8_bundle, backend="ort").generate(PROMPT, 16, method="none", temperature=0)
    got = load(lean_int4_bundle, backend="ort").generate(PROMPT, 16, method=method, temperature=0,
                                                         num_speculative_tokens=2)
    assert got.token_ids == ref.token_ids  # same int4 fused target graph; greedy speculation is exact


@pytest.mark.parametrize("backend,option", [("torch", "--keep-fp32"), ("ort-portable", "--ort-graph both")])
def test_a_left_out_graph_is_refused_in_one_line(lean_int4_bundle, int4_self8_bundle, backend, option):
    with pytest.raises(BundleError, match=f"left out: recompile with {option}"):
        load(lean_int4_bundle, backend=backend)
    proc = run_cli("generate", lean_int4_bundle, "--prompt", "hi", "--max-new-tokens", "2", "--backend", backend)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and option in lines[0], proc.stderr
    load(int4_self8_bundle, backend=backend, warmup=False)  # the full bundle has that graph


def test_inspect_names_what_was_left_out(lean_int4_bundle):
    proc = run_cli("inspect", lean_int4_bundle)
    assert proc.returncode == 0, proc.stderr
    assert "left out (lean bundle" in proc.stdout and "quantized.portable" in proc.stdout
    proc = run_cli("inspect", lean_int4_bundle, "--json")
    models = json.loads(proc.stdout)["models"]
    assert models["target"]["omitted"] == ["portable", "fused", "quantized.portable"]
    # the graphs and the quantized files it lists are the ones in the bundle (it listed the left-out ones too)
    listed = [g["onnx"] for g in models["target"]["graphs"].values()]
    listed += list(models["target"]["quantization"]["onnx"].values())
    assert listed and all((lean_int4_bundle / f).is_file() for f in listed), listed


def test_auto_backend_on_a_gpu_machine_runs_what_a_lean_bundle_has(lean_int4_bundle, int4_self8_bundle, monkeypatch):
    import specrt.runtime.backends as backends

    monkeypatch.setattr(backends, "ort_cuda_usable", lambda: True)  # as on a machine with a usable CUDA provider
    assert backends.resolve_backend("auto", read_manifest(int4_self8_bundle)) == "ort-cuda"
    assert backends.resolve_backend("auto", read_manifest(lean_int4_bundle)) == "ort"  # its only graph: CPU fused
