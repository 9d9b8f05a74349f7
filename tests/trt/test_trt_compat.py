"""Engine loading safety without TensorRT: fabricated mismatches of version, GPU, CUDA, checksum, truncation."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from specrt.bundle.parts import EngineEntry
from specrt.runtime.backends.trt.compat import check_call, check_engine_entry, engine_from_bytes, parse_cc, parse_version
from specrt.core.errors import BackendError, BundleError, ChecksumMismatch, VersionMismatch

ENTRY = {"path": "target/model.fp32.engine", "tensorrt_version": "10.3.0.26", "cuda_version": "12.4",
         "gpu_name": "NVIDIA L4", "compute_capability": "8.9", "hardware_compatibility_level": "none",
         "version_compatible": False, "precision": "fp32", "profiles": ["prefill", "decode", "verify"]}
HERE = {"tensorrt_version": "10.3.0", "cuda_version": "12.6", "gpu_name": "NVIDIA L4", "compute_capability": "8.9"}


def check(entry: dict, installed: dict) -> None:
    """The manifest's engine entry (as read_manifest builds it) against the installed facts."""
    check_engine_entry("target", EngineEntry.from_dict("target", entry), installed)


def test_matching_engine_passes():
    check(ENTRY, HERE)


def test_tensorrt_version_mismatch_names_both_and_the_fix():
    with pytest.raises(VersionMismatch) as err:
        check(ENTRY, dict(HERE, tensorrt_version="10.7.0"))
    assert "10.3.0.26" in str(err.value) and "10.7.0" in str(err.value) and "specrt compile" in str(err.value)
    assert "--engines trt" in str(err.value)


def test_version_compatible_engine_runs_on_later_tensorrt_only():
    vc = dict(ENTRY, version_compatible=True)
    check(vc, dict(HERE, tensorrt_version="10.7.0"))
    with pytest.raises(VersionMismatch, match="older"):
        check(vc, dict(HERE, tensorrt_version="10.1.0"))


def test_compute_capability_mismatch():
    with pytest.raises(VersionMismatch, match=r"compute 8\.9.*compute 8\.6.*ampere-plus"):
        check(ENTRY, dict(HERE, compute_capability="8.6", gpu_name="RTX 3090"))
    same = dict(ENTRY, hardware_compatibility_level="same_compute_capability")
    check(same, dict(HERE, gpu_name="RTX 4090"))
    with pytest.raises(VersionMismatch):
        check(same, dict(HERE, compute_capability="9.0"))


def test_ampere_plus():
    amp = dict(ENTRY, hardware_compatibility_level="ampere_plus")
    check(amp, dict(HERE, compute_capability="9.0"))
    with pytest.raises(VersionMismatch, match=r"compute 7\.5"):
        check(amp, dict(HERE, compute_capability="7.5"))


def test_cuda_major_mismatch():
    with pytest.raises(VersionMismatch, match="CUDA 12.4.*CUDA 13.0"):
        check(ENTRY, dict(HERE, cuda_version="13.0"))


def test_malformed_entries():
    with pytest.raises(BundleError, match="engines.target lacks compute_capability"):
        check({k: v for k, v in ENTRY.items() if k != "compute_capability"}, HERE)
    with pytest.raises(BundleError, match="hardware_compatibility_level"):
        check(dict(ENTRY, hardware_compatibility_level="turing_plus"), HERE)


def test_parsers():
    assert parse_version("10.3.0.26") == (10, 3, 0, 26) and parse_version("12.4") == (12, 4)
    assert parse_cc("8.9") == (8, 9) and parse_cc("sm_90") == (9, 0) and parse_cc((8, 6)) == (8, 6)


class FakeRuntime:
    def __init__(self, result=None, exc=None):
        self.result, self.exc = result, exc

    def deserialize_cuda_engine(self, blob):
        if self.exc:
            raise self.exc
        return self.result


def test_deserialize_none_is_a_typed_error_never_attribute_error():
    with pytest.raises(VersionMismatch, match="expecting compute 8.9 got compute 8.6"):
        engine_from_bytes(FakeRuntime(None), b"plan", "target", ["expecting compute 8.9 got compute 8.6"])
    with pytest.raises(BundleError, match="corrupted"):
        engine_from_bytes(FakeRuntime(None), b"garbage", "draft", ["Magic tag does not match"])
    with pytest.raises(BundleError, match="TypeError"):
        engine_from_bytes(FakeRuntime(exc=TypeError("bad")), b"x", "draft")
    with pytest.raises(BundleError, match="empty"):
        engine_from_bytes(FakeRuntime(object()), b"", "draft")
    sentinel = object()
    assert engine_from_bytes(FakeRuntime(sentinel), b"plan", "target") is sentinel


def test_check_call_names_the_call():
    check_call(True, "set_input_shape", "x")
    with pytest.raises(BackendError, match=r"set_input_shape failed \(past_key.0 \(1, 5, 2, 16\)"):
        check_call(False, "set_input_shape", "past_key.0 (1, 5, 2, 16)")


def _bundle_with_fake_engine(src, dst):
    from specrt.bundle.manifest import file_entries

    shutil.copytree(src, dst)
    (dst / "target" / "model.fp32.engine").write_bytes(b"\x00fake plan\x00" * 100)
    m = json.loads((dst / "manifest.json").read_text())
    m["engines"] = {"target": ENTRY}
    m["files"] = file_entries(dst)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def test_corrupted_or_truncated_engine_is_refused_at_load(pair_bundle, tmp_path):
    from specrt.bundle.manifest import read_manifest

    b = _bundle_with_fake_engine(pair_bundle, tmp_path / "b")
    assert read_manifest(b).engines["target"].precision == "fp32"
    engine = b / "target" / "model.fp32.engine"
    data = bytearray(engine.read_bytes())
    data[5] ^= 0xFF
    engine.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match="model.fp32.engine.*sha256"):
        read_manifest(b)
    engine.write_bytes(bytes(data[:-10]))
    with pytest.raises(ChecksumMismatch, match="truncated"):
        read_manifest(b)


def test_auto_backend_falls_back_to_ort_with_a_warning(pair_bundle, tmp_path):
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends import resolve_backend

    m = read_manifest(_bundle_with_fake_engine(pair_bundle, tmp_path / "b"))
    with pytest.warns(UserWarning, match="TensorRT is not installed.*falling back to ONNX Runtime"):
        assert resolve_backend("auto", m) == "ort"


def test_engine_entry_written_by_the_builder_reads_back_and_passes_the_check():
    from specrt.compiler.trt.build import engine_entry
    from specrt.compiler.trt.options import BuildOptions

    facts = dict(HERE, tensorrt_version="10.3.0.26")
    entry = engine_entry("target", "target/model.fp16.engine", BuildOptions(precision="fp16"), facts)
    data = entry.to_dict()
    assert list(data) == ["path", "tensorrt_version", "cuda_version", "gpu_name", "compute_capability",
                          "hardware_compatibility_level", "version_compatible", "lean_runtime_embedded", "precision",
                          "workspace_bytes", "builder_optimization_level", "profiles"]
    assert data["profiles"] == ["prefill", "decode", "verify"] and data["builder_optimization_level"] is None
    assert EngineEntry.from_dict("target", data) == entry
    check_engine_entry("target", entry, HERE)


def test_unavailable_reason_checks_every_engine_entry(pair_bundle, tmp_path, monkeypatch):
    """With TensorRT and a GPU faked present, the reason comes from the typed engine entries."""
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends.trt import runner

    m = read_manifest(_bundle_with_fake_engine(pair_bundle, tmp_path / "b"))
    monkeypatch.setattr(runner, "trt_import_error", lambda: None)
    monkeypatch.setattr(runner, "cuda_device_error", lambda device: None)
    monkeypatch.setattr(runner, "installed_facts", lambda device: HERE)
    assert "no TensorRT engine for draft" in runner.trt_unavailable_reason(m)
    engines = dict(m.engines, draft=dataclasses.replace(m.engines["target"], role="draft"))
    assert runner.trt_unavailable_reason(dataclasses.replace(m, engines=engines)) is None
    monkeypatch.setattr(runner, "installed_facts", lambda device: dict(HERE, compute_capability="8.6"))
    assert "compute 8.9" in runner.trt_unavailable_reason(dataclasses.replace(m, engines=engines))
