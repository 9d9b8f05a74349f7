"""compile: the bundle's manifest, atomic writes, and every bad input with a clear error."""

import json
import shutil

import pytest

from helpers import make_checkpoint, train_tokenizer

from specrt.bundle.manifest import read_manifest
from specrt.compiler import CompileSpec, compile_bundle
from specrt.core.errors import BundleError, ChecksumMismatch, CheckpointError, InvalidArgument


def test_manifest_records_what_load_needs(pair_bundle):
    m = read_manifest(pair_bundle)
    assert m.format == "specrt-bundle" and m.format_version == 1
    assert m.onnx == {"opset": 18, "ir_version": 10}
    assert m.max_seq_len == 128 and m.max_draft_tokens == 8
    for role in ("target", "draft"):
        e = m.models[role]
        assert e.architecture == "LlamaForCausalLM"
        assert e.inputs[0].name == "input_ids" and e.outputs[0].name == "logits"
        assert set(e.profiles) == {"prefill", "decode", "verify"}
        assert e.validation["max_abs_diff"] < 1e-4
        assert e.onnx in m.files and e.onnx_data in m.files
    for rel, meta in m.files.items():
        assert not rel.startswith("/") and ".." not in rel and len(meta.sha256) == 64


def test_existing_output_needs_force(pair_bundle, llama_target):
    with pytest.raises(InvalidArgument, match="--force"):
        compile_bundle(CompileSpec(llama_target, pair_bundle, max_seq_len=64, max_draft_tokens=4))


def test_failed_compile_leaves_nothing(tmp_path, llama_target, workdir):
    other_tok = train_tokenizer(tmp_path / "tok2" / "tokenizer.json", vocab_size=300)
    mismatched = make_checkpoint(tmp_path / "other", "llama", other_tok, layers=1)
    out = tmp_path / "bundle"
    with pytest.raises(CheckpointError, match="vocabularies differ"):
        compile_bundle(CompileSpec(llama_target, out, mismatched, max_seq_len=64, max_draft_tokens=4))
    assert list(tmp_path.glob("bundle*")) == [] and list(tmp_path.glob(".bundle*")) == []


def test_interrupted_compile_leaves_nothing(tmp_path, llama_target):
    def boom(tmp, manifest):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        compile_bundle(CompileSpec(llama_target, tmp_path / "b", max_seq_len=64, max_draft_tokens=4),
                       extra_steps=[boom])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_seq_len=1), "max-seq-len"),
    (dict(max_draft_tokens=0), "max-draft-tokens"),
    (dict(max_draft_tokens=65), "max-draft-tokens"),
])
def test_bad_compile_arguments(tmp_path, llama_target, kwargs, match):
    args = dict(max_seq_len=64, max_draft_tokens=4) | kwargs
    with pytest.raises(InvalidArgument, match=match):
        compile_bundle(CompileSpec(llama_target, tmp_path / "b", **args))


def test_unsupported_architecture_lists_supported(tmp_path, llama_target):
    ck = tmp_path / "ck"
    shutil.copytree(llama_target, ck)
    raw = json.loads((ck / "config.json").read_text())
    raw["architectures"] = ["FalconForCausalLM"]
    (ck / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="unsupported architecture FalconForCausalLM; supported: LlamaForCausalLM"):
        compile_bundle(CompileSpec(ck, tmp_path / "b", max_seq_len=64, max_draft_tokens=4))


def test_missing_weights(tmp_path, llama_target):
    ck = tmp_path / "ck"
    shutil.copytree(llama_target, ck)
    for f in ck.glob("*.safetensors*"):
        f.unlink()
    with pytest.raises(CheckpointError, match="no weights"):
        compile_bundle(CompileSpec(ck, tmp_path / "b", max_seq_len=64, max_draft_tokens=4))


def test_missing_tensor_in_weights(tmp_path, llama_target):
    from safetensors.torch import load_file, save_file

    ck = tmp_path / "ck"
    shutil.copytree(llama_target, ck)
    tensors = load_file(str(ck / "model.safetensors"))
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, str(ck / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing 1 weight"):
        compile_bundle(CompileSpec(ck, tmp_path / "b", max_seq_len=64, max_draft_tokens=4))


def copy_bundle(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_load_rejects_corrupted_file(tmp_path, pair_bundle):
    from specrt.runtime import load

    b = copy_bundle(pair_bundle, tmp_path / "b")
    for rel in ("target/model.onnx.data", "target/model.fused.onnx.data"):
        raw = bytearray((b / rel).read_bytes())
        raw[100] ^= 0xFF
        (b / rel).write_bytes(bytes(raw))
    # load hashes the files its backend opens, before opening any: the CPU runner opens the fused graph,
    # the portable backends the portable one
    with pytest.raises(ChecksumMismatch, match="target/model.fused.onnx.data has sha256"):
        load(b, backend="ort")
    for backend in ("ort-portable", "torch"):
        with pytest.raises(ChecksumMismatch, match="target/model.onnx.data has sha256"):
            load(b, backend=backend)


def test_load_does_not_hash_graphs_its_backend_never_opens(tmp_path, pair_bundle):
    """The portable graph's weights corrupted (same size): the CPU runner, which runs the fused graph, loads
    and decodes exactly as before; `inspect` (every file) still reports the corruption."""
    from specrt.cli.inspect_checks import read_for_inspect
    from specrt.runtime import load

    b = copy_bundle(pair_bundle, tmp_path / "b")
    raw = bytearray((b / "target" / "model.onnx.data").read_bytes())
    raw[100] ^= 0xFF
    (b / "target" / "model.onnx.data").write_bytes(bytes(raw))
    expected = load(pair_bundle, backend="ort").generate("def main(", 8, method="none").token_ids
    assert load(b, backend="ort").generate("def main(", 8, method="none").token_ids == expected
    _, failed = read_for_inspect(b)
    assert any("target/model.onnx.data" in f for f in failed)


def test_load_rejects_truncated_and_missing_files(tmp_path, pair_bundle):
    from specrt.runtime import load

    b = copy_bundle(pair_bundle, tmp_path / "b")
    data = b / "draft" / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-10])
    with pytest.raises(ChecksumMismatch, match="truncated"):
        load(b)
    data.unlink()
    with pytest.raises(BundleError, match="missing"):
        load(b)


@pytest.mark.parametrize("bad_path", ["/etc/passwd", "../outside.onnx", "target/../../x"])
def test_manifest_paths_must_be_relative(tmp_path, pair_bundle, bad_path):
    from specrt.runtime import load

    b = copy_bundle(pair_bundle, tmp_path / "b")
    m = json.loads((b / "manifest.json").read_text())
    m["files"][bad_path] = {"sha256": "0" * 64, "size": 1}
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="absolute|'\\.\\.'"):
        load(b)


def test_missing_bundle_and_manifest(tmp_path):
    from specrt.runtime import load

    with pytest.raises(BundleError, match="does not exist"):
        load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="no manifest.json"):
        load(tmp_path / "empty")
