"""The manifest schema (issue 11): typed dataclasses validated on construction, read from and written back to
the JSON key for key. data/manifest_v1_*.json were written by `specrt compile` before the schema existed
(main at 9a64c49, the packaged demo pair: `--draft specrt/assets/demo/draft --medusa ...`, and
`--draft self:int4 --quantize int8 --medusa ...`, both `--max-seq-len 128 --max-draft-tokens 4`)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from specrt.bundle import (EngineEntry, FileEntry, GraphVariant, Manifest, MedusaEntry, ModelEntry, TokenizerEntry,
                           read_manifest)
from specrt.core.errors import BundleError, ManifestError, VersionMismatch

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("manifest_v1_*.json"))
ENGINE = {"path": "target/model.fp32.engine", "tensorrt_version": "10.3.0.26", "cuda_version": "12.4",
          "gpu_name": "NVIDIA L4", "compute_capability": "8.9", "hardware_compatibility_level": "none",
          "version_compatible": False, "lean_runtime_embedded": False, "precision": "fp32",
          "workspace_bytes": 1 << 30, "builder_optimization_level": None, "profiles": ["prefill", "decode", "verify"]}


def dumps(data) -> str:
    return json.dumps(data, indent=2) + "\n"  # how compile writes manifest.json


def fixture(name: str = "manifest_v1_pair.json") -> dict:
    return json.loads((DATA / name).read_text())


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_manifests_written_before_the_schema_round_trip_byte_for_byte(path):
    text = path.read_text()
    m = Manifest.from_dict(json.loads(text))
    assert isinstance(m.models["target"], ModelEntry) and isinstance(m.tokenizer, TokenizerEntry)
    assert isinstance(m.medusa, MedusaEntry) and m.medusa.num_heads >= 1
    assert dumps(m.to_dict()) == text


def test_compiled_bundle_round_trips_byte_for_byte(pair_bundle):
    text = (pair_bundle / "manifest.json").read_text()
    m = read_manifest(pair_bundle)
    assert m.root == pair_bundle and dumps(m.to_dict()) == text


def test_typed_fields_of_a_quantized_self_draft_bundle():
    m = Manifest.from_dict(fixture("manifest_v1_self_int8.json"))
    target, draft = m.models["target"], m.models["draft"]
    assert target.decoder_config.num_layers >= 1 and target.graph("fused").onnx == "target/model.fused.onnx"
    assert target.quantization.type == "int8" and target.ort_onnx == "target/model.int8.onnx"
    assert draft.self_draft and draft.role == "draft" and draft.onnx == "target/model.onnx"
    assert draft.ort_onnx == "draft/model.int4.onnx" and draft.quantization.graphs["portable"].quantized_matmuls > 0
    assert m.files["target/model.onnx"].size > 0 and m.referenced_paths()["models.draft.onnx"] == "target/model.onnx"


def test_version_1_manifest_without_later_keys_still_loads():
    """Bundles written before graph variants, quantization, sources and the chat-template key existed."""
    data = fixture()
    for entry in data["models"].values():
        for key in ("graphs", "source", "fused_skipped", "inputs", "outputs"):
            entry.pop(key, None)
    del data["tokenizer"]["chat_template"]
    m = Manifest.from_dict(copy.deepcopy(data))
    target = m.models["target"]
    assert target.graphs is None and target.graph("portable") == GraphVariant("target/model.onnx",
                                                                               "target/model.onnx.data")
    assert target.graph("fused") is None and target.ort_onnx == "target/model.onnx"
    assert not m.tokenizer.chat_template_recorded and m.tokenizer.chat_template_source == m.tokenizer.config
    assert m.to_dict() == data  # nothing invented on the way back


def test_unknown_keys_are_kept():
    data = fixture()
    data["future"] = {"x": 1}
    data["models"]["target"]["future_model_key"] = [1, 2]
    data["models"]["target"]["graphs"]["portable"]["future_graph_key"] = "y"
    data["tokenizer"]["future_tokenizer_key"] = True
    data["engines"] = {"target": dict(ENGINE, future_engine_key=3)}
    data["files"][ENGINE["path"]] = {"sha256": "0" * 64, "size": 10}
    m = Manifest.from_dict(copy.deepcopy(data))
    assert m.extra == {"future": {"x": 1}} and m.models["target"].extra == {"future_model_key": [1, 2]}
    assert m.to_dict() == data


def test_engine_entry_round_trip_and_missing_facts():
    e = EngineEntry.from_dict("target", ENGINE)
    assert e.profiles == ("prefill", "decode", "verify") and e.to_dict() == ENGINE
    assert list(e.to_dict()) == list(ENGINE)
    with pytest.raises(ManifestError, match="engines.target lacks gpu_name, precision"):
        EngineEntry.from_dict("target", {k: v for k, v in ENGINE.items() if k not in ("gpu_name", "precision")})


def test_a_newer_format_version_is_refused():
    for version in (2, 0, True, "1", None):
        with pytest.raises(VersionMismatch, match="format version") as refused:
            Manifest.from_dict(dict(fixture(), format_version=version))
        if not isinstance(version, int) or isinstance(version, bool):  # was "version 1 but ... reads version 1"
            assert f"format version {version!r} is not an integer" in str(refused.value)
    with pytest.raises(BundleError, match="format is 'other'"):
        Manifest.from_dict(dict(fixture(), format="other"))


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return Manifest.from_dict(fixture())


def _replace_model(m: Manifest, **changes) -> Manifest:
    return dataclasses.replace(m, models=dict(m.models, target=dataclasses.replace(m.models["target"], **changes)))


@pytest.mark.parametrize("build, key", [
    (lambda m: dataclasses.replace(m, max_seq_len=1), "max_seq_len"),
    (lambda m: dataclasses.replace(m, max_seq_len=256), "max_seq_len"),  # profiles were built for 128
    (lambda m: dataclasses.replace(m, max_draft_tokens=0), "max_draft_tokens"),
    (lambda m: dataclasses.replace(m, max_draft_tokens=5), "max_draft_tokens"),  # profiles: 4
    (lambda m: dataclasses.replace(m, models={"draft": m.models["draft"]}), "models.target"),
    (lambda m: dataclasses.replace(m, files={}), "no file list"),
    (lambda m: dataclasses.replace(m, files={k: v for k, v in m.files.items() if k != "draft/model.onnx.data"}),
     "models.draft.onnx_data"),
    (lambda m: _replace_model(m, onnx=""), "models.target.onnx"),
    (lambda m: _replace_model(m, vocab_size=7), "models.target.vocab_size"),
    (lambda m: _replace_model(m, eos_token_ids=(-1,)), "models.target.eos_token_ids"),
    (lambda m: _replace_model(m, decoder_config={"num_layers": 2}), "models.target.decoder_config"),
    (lambda m: _replace_model(m, decoder_config=dataclasses.replace(m.models["target"].decoder_config,
                                                                   intermediate_size=0)),
     "models.target.decoder_config.intermediate_size"),
    (lambda m: dataclasses.replace(m, batch_size=0), "batch_size"),
    (lambda m: dataclasses.replace(m, batch_size=True), "batch_size"),
    (lambda m: _replace_model(m, bos_token_id=2 ** 31), "models.target.bos_token_id"),
    (lambda m: dataclasses.replace(m.tokenizer, path=""), "tokenizer.path"),
    (lambda m: dataclasses.replace(m.tokenizer, bos_token_id=-3), "tokenizer.bos_token_id"),
    (lambda m: dataclasses.replace(m.medusa, num_heads=0), "medusa.num_heads"),
    (lambda m: FileEntry("abc", 1, "files['x']"), r"files\['x'\]"),
    (lambda m: FileEntry("0" * 64, -1, "files['x']"), r"files\['x'\].size"),
    (lambda m: dataclasses.replace(EngineEntry.from_dict("draft", ENGINE), path=None), "engines.draft.path"),
])
def test_construction_validates_and_names_the_key(manifest, build, key):
    with pytest.raises(ManifestError, match=key):
        build(manifest)


@pytest.mark.parametrize("tamper, key", [
    (lambda d: d["models"]["draft"]["graphs"].update(fused=[1]), "models.draft.graphs.fused"),
    (lambda d: d["models"]["target"]["inputs"][0].pop("name"), r"models.target.inputs\[0\].name"),
    (lambda d: d["models"]["target"].update(profiles="x"), "models.target.profiles"),
    (lambda d: d.update(engines={"target": []}), "engines.target"),
    (lambda d: d.update(medusa={"onnx": "medusa/heads.onnx"}), "medusa.num_heads"),
    (lambda d: d["tokenizer"].update(eos_token_ids=[True]), "tokenizer.eos_token_ids"),
    (lambda d: d["models"]["target"]["decoder_config"].update(sliding_window=-5),
     "models.target.decoder_config.*sliding_window"),
    (lambda d: d.update(batch_size=0), "batch_size"),
])
def test_reading_names_the_key(tamper, key):
    data = fixture()
    tamper(data)
    with pytest.raises(ManifestError, match=key):
        Manifest.from_dict(data)
