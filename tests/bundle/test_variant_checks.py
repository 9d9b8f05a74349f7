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


def _quant(**fields):
    return lambda m: m["models"]["draft"]["quantization"].update(fields)


@pytest.mark.parametrize("edit, says", [
    # an int4 graph labelled int8 (type and bits edited together): the graph's nodes say 4 bits
    (_quant(type="int8", bits=8), "4-bit MatMulNBits nodes but models.draft.quantization.type is 'int8' (8 bits)"),
    (_quant(type="int8"), "models.draft.quantization.bits is 4 but models.draft.quantization.type is 'int8'"),
    (_quant(block_size=0), "models.draft.quantization.block_size' must be an integer in [16, 256], got 0"),
    (_quant(block_size=48), "block_size must be a power of two, got 48"),
    (_quant(block_size=64), "MatMulNBits nodes of block size 32 but models.draft.quantization.block_size is 64"),
    (_quant(accuracy_level=1), "accuracy level 4 but models.draft.quantization.accuracy_level is 1"),
    (_quant(min_rows=0), "min_rows' must be an integer in [1, 16], got 0"),
])
def test_quantization_record_must_describe_its_graphs(int4_bundle, tmp_path, edit, says):
    """The manifest's quantization fields are checked on their own and against the graphs' MatMulNBits nodes
    (before: a manifest calling an int4 graph int8, or block_size 0, loaded)."""
    import re

    b = Path(shutil.copytree(int4_bundle, tmp_path / "q"))
    rewrite(b, edit)
    with pytest.raises(ManifestError, match=re.escape(says)):
        read_manifest(b)
