"""Every graph variant the runtime can open (portable, fused, quantized) passes the same load checks:
external data listed, inputs/outputs as declared, the slot's precision (bundle/checks.py check_graphs)."""

import json
import shutil
from pathlib import Path

import onnx
import pytest

from specrt.bundle.manifest import file_entries, read_manifest
from specrt.core.errors import ManifestError


def rewrite(bundle: Path, fn=None) -> None:
    """Apply `fn` to the manifest and recompute the file list (a tamperer who also edits the checksums)."""
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    if fn:
        fn(data)
    data["files"] = file_entries(bundle)
    path.write_text(json.dumps(data))


@pytest.fixture
def bundle(tmp_path, pair_bundle):
    return Path(shutil.copytree(pair_bundle, tmp_path / "b"))


@pytest.fixture(scope="module")
def int4_bundle(tmp_path_factory, llama_target):
    from specrt.compiler import CompileSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, tmp_path_factory.mktemp("q") / "q", "self:int4", max_seq_len=64,
                          max_draft_tokens=4))


def test_fused_graph_external_data_must_be_listed(bundle, tmp_path):
    graph = bundle / "target" / "model.fused.onnx"
    model = onnx.load_model(str(graph), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "planted.data"
    onnx.save_model(model, str(graph))
    shutil.copy(bundle / "target" / "model.fused.onnx.data", tmp_path / "planted.data")
    rewrite(bundle)  # the graph's new checksum is listed; planted.data is not
    shutil.copy(tmp_path / "planted.data", bundle / "target" / "planted.data")
    with pytest.raises(ManifestError, match="planted.data.*not a listed bundle file"):
        read_manifest(bundle)


def test_fused_graph_of_another_model_is_refused(bundle):
    for suffix in ("", ".data"):
        shutil.copy(bundle / "draft" / f"model.fused.onnx{suffix}", bundle / "target" / f"model.fused.onnx{suffix}")
    rewrite(bundle)
    with pytest.raises(ManifestError, match="models.target.graphs.fused"):
        read_manifest(bundle)


def test_fp32_graph_in_the_int4_slot_is_refused(int4_bundle, tmp_path):
    b = Path(shutil.copytree(int4_bundle, tmp_path / "q"))
    read_manifest(b)  # the bundle as compiled loads

    def swap(m):
        fp32 = m["models"]["draft"]["graphs"]["fused"]
        m["models"]["draft"]["quantization"]["graphs"]["fused"].update(onnx=fp32["onnx"], onnx_data=fp32["onnx_data"])

    rewrite(b, swap)
    with pytest.raises(ManifestError, match="quantization.graphs.fused.*quantized MatMuls"):
        read_manifest(b)
