"""What `load` verifies in a manifest before any backend runs (README "Safety"), beyond checksums.

* Structure and values: types, ranges and consistency (`max_seq_len` against the recorded profiles, the
  decoder config against the ONNX graph's inputs and outputs), each failure a `ManifestError` naming
  the key.
* Files: the file list is non-empty; every path the manifest references (graphs, their external data,
  configs, tokenizer, engines) is listed, so it is checksummed; every listed path resolves (symlinks
  followed) inside the bundle root.
* Memory: the KV cache that `max_seq_len` and the decoder config imply must fit in available memory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..core.errors import BundleError, ManifestError
from ..models.config import decoder_config

MAX_SEQ_LEN_LIMIT = 1 << 20
MAX_DRAFT_TOKENS_LIMIT = 64
SHA256 = re.compile(r"^[0-9a-f]{64}$")


# ---------------------------------------------------------------------------------------- values
def _int(value: Any, key: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ManifestError(f"manifest key {key!r} must be an integer in {rng}, got {value!r}; recompile the bundle")
    return value


def _dict(value: Any, key: str) -> dict:
    if not isinstance(value, dict):
        raise ManifestError(f"manifest key {key!r} must be an object, got {type(value).__name__}; "
                            "recompile the bundle")
    return value


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ManifestError(f"manifest key {key!r} must be a non-empty string, got {value!r}; recompile the bundle")
    return value


def _ids(value: Any, key: str) -> None:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        raise ManifestError(f"manifest key {key!r} must be a list of token ids, got {value!r}")


def check_values(data: dict) -> None:
    """Types and ranges of every key the runtime reads."""
    seq = _int(data["max_seq_len"], "max_seq_len", 2, MAX_SEQ_LEN_LIMIT)
    k = _int(data["max_draft_tokens"], "max_draft_tokens", 1, MAX_DRAFT_TOKENS_LIMIT)
    if k + 2 > seq:
        raise ManifestError(f"manifest: max_draft_tokens {k} leaves no room in max_seq_len {seq}")
    tok = _dict(data["tokenizer"], "tokenizer")
    _str(tok.get("path"), "tokenizer.path")
    if tok.get("config") is not None:
        _str(tok["config"], "tokenizer.config")
    _ids(tok.get("eos_token_ids", []), "tokenizer.eos_token_ids")
    if tok.get("bos_token_id") is not None:
        _int(tok["bos_token_id"], "tokenizer.bos_token_id", 0)
    models = _dict(data["models"], "models")
    if "target" not in models:
        raise ManifestError("manifest has no models.target; recompile the bundle")
    for role, entry in models.items():
        check_model_entry(role, _dict(entry, f"models.{role}"), seq, k)
    if "medusa" in data:
        med = _dict(data["medusa"], "medusa")
        _int(med.get("num_heads"), "medusa.num_heads", 1, MAX_DRAFT_TOKENS_LIMIT)
        _str(med.get("onnx"), "medusa.onnx")
    for role, engine in _dict(data.get("engines", {}), "engines").items():
        _str(_dict(engine, f"engines.{role}").get("path"), f"engines.{role}.path")


def check_model_entry(role: str, entry: dict, max_seq_len: int, max_draft_tokens: int) -> None:
    key = f"models.{role}"
    _str(entry.get("onnx"), f"{key}.onnx")
    _dict(entry.get("decoder_config"), f"{key}.decoder_config")
    try:
        config = decoder_config(entry)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise ManifestError(f"manifest key {key}.decoder_config is malformed ({type(exc).__name__}: {exc}); "
                            "recompile the bundle") from None
    except BundleError:
        raise
    except Exception as exc:  # CheckpointError from DecoderConfig's own checks
        raise ManifestError(f"manifest key {key}.decoder_config: {exc}") from None
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "intermediate_size"):
        _int(getattr(config, name), f"{key}.decoder_config.{name}", 1, 1 << 24)
    if "vocab_size" in entry and entry["vocab_size"] != config.vocab_size:
        raise ManifestError(f"manifest key {key}.vocab_size {entry['vocab_size']!r} disagrees with "
                            f"{key}.decoder_config.vocab_size {config.vocab_size}")
    profiles = entry.get("profiles")
    if profiles is not None:
        check_profiles(_dict(profiles, f"{key}.profiles"), key, max_seq_len, max_draft_tokens)


def check_profiles(profiles: dict, key: str, max_seq_len: int, max_draft_tokens: int) -> None:
    """The recorded profiles were derived from max_seq_len / max_draft_tokens at compile time: an edited
    limit would run shapes the graphs were never validated (or TensorRT engines built) for."""
    try:
        past_max = profiles["decode"]["past_key.0"]["max"][1]
        verify_max = profiles["verify"]["input_ids"]["max"][1]
    except (KeyError, IndexError, TypeError):
        raise ManifestError(f"manifest key {key}.profiles lacks decode/verify shapes; recompile the bundle") from None
    if past_max != max_seq_len - 1:
        raise ManifestError(f"manifest key 'max_seq_len' is {max_seq_len} but {key} was compiled and validated for "
                            f"{past_max + 1} (profiles); recompile with --max-seq-len {max_seq_len}")
    if verify_max != max_draft_tokens + 1:
        raise ManifestError(f"manifest key 'max_draft_tokens' is {max_draft_tokens} but {key} was compiled for "
                            f"{verify_max - 1} (profiles); recompile with --max-draft-tokens {max_draft_tokens}")


def check_memory(data: dict) -> None:
    """The KV caches `load` preallocates must fit in available memory (no MemoryError mid-load)."""
    import psutil

    total = 0
    for entry in data["models"].values():
        c = decoder_config(entry)
        total += 2 * c.num_layers * data["max_seq_len"] * c.num_kv_heads * c.head_dim * 4
    available = psutil.virtual_memory().available
    if total > available:
        raise ManifestError(f"manifest max_seq_len {data['max_seq_len']} needs {total / 2**30:.1f} GiB of KV cache, "
                            f"{available / 2**30:.1f} GiB are available")


# ----------------------------------------------------------------------------------------- files
def referenced_paths(data: dict) -> dict[str, str]:
    """{manifest key: relative path} for every file the runtime may open."""
    refs: dict[str, str] = {"tokenizer.path": data["tokenizer"]["path"]}
    if data["tokenizer"].get("config"):
        refs["tokenizer.config"] = data["tokenizer"]["config"]
    for role, entry in data["models"].items():
        for name in ("onnx", "onnx_data", "config"):
            if entry.get(name):
                refs[f"models.{role}.{name}"] = entry[name]
    for name in ("onnx", "onnx_data", "config"):
        if data.get("medusa", {}).get(name):
            refs[f"medusa.{name}"] = data["medusa"][name]
    for role, engine in data.get("engines", {}).items():
        refs[f"engines.{role}.path"] = engine["path"]
    return refs


def check_file_list(data: dict) -> None:
    files = data["files"]
    if not isinstance(files, dict) or not files:
        raise ManifestError("manifest has no file list ('files' is empty): nothing could be verified; "
                            "recompile the bundle")
    for rel, meta in files.items():
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str) or not SHA256.match(meta["sha256"]):
            raise ManifestError(f"manifest key files[{rel!r}] needs a sha256 (64 hex digits); recompile the bundle")
        _int(meta.get("size"), f"files[{rel!r}].size", 0)
    for key, rel in referenced_paths(data).items():
        if not isinstance(rel, str) or rel not in files:
            raise ManifestError(f"manifest key {key} names {rel!r}, which is not in the manifest's file list "
                                "(unverified files are not opened); recompile the bundle")


def resolve_inside(root: Path, rel: str) -> Path:
    """root / rel with every symlink resolved; BundleError if that leaves the bundle root."""
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(root / rel))
    if real != real_root and real_root not in real.parents:
        raise BundleError(f"bundle file {rel} resolves to {real}, outside the bundle {real_root} (a symlink?): "
                          "refusing to open it")
    return real


def check_graphs(root: Path, data: dict) -> None:
    """Every external-data file an ONNX graph names is listed (and so verified) and inside the bundle, and
    each decoder graph has the layers and vocabulary its manifest entry says."""
    import onnx

    graphs = {f"models.{role}": e["onnx"] for role, e in data["models"].items()}
    if data.get("medusa"):
        graphs["medusa"] = data["medusa"]["onnx"]
    for key, rel in graphs.items():
        try:
            model = onnx.load_model(str(resolve_inside(root, rel)), load_external_data=False)
        except BundleError:
            raise
        except Exception as exc:  # protobuf's DecodeError and friends
            raise BundleError(f"bundle file {rel} is not a readable ONNX graph ({type(exc).__name__}); "
                              "recompile the bundle") from None
        if key.startswith("models."):
            check_graph_shapes(model, decoder_config(data["models"][key.split(".", 1)[1]]), key, rel)
        folder = Path(rel).parent
        locations = {entry.value for t in model.graph.initializer for entry in t.external_data
                     if entry.key == "location"}
        for loc in locations:
            ref = (folder / loc).as_posix()
            if ".." in Path(loc).parts or Path(loc).is_absolute() or ref not in data["files"]:
                raise ManifestError(f"{rel} reads external data {loc!r}, which is not a listed bundle file; "
                                    "recompile the bundle")


def check_graph_shapes(model, config, key: str, rel: str) -> None:
    """Layers, KV heads, head size and vocabulary of the graph against `key`.decoder_config."""
    def dims(value_info):
        return [d.dim_value if d.HasField("dim_value") else None for d in value_info.type.tensor_type.shape.dim]

    inputs = {i.name: dims(i) for i in model.graph.input}
    outputs = {o.name: dims(o) for o in model.graph.output}
    layers = sum(1 for name in inputs if name.startswith("past_key."))
    found = {"num_layers": layers}
    if "past_key.0" in inputs and len(inputs["past_key.0"]) == 4:
        found["num_kv_heads"], found["head_dim"] = inputs["past_key.0"][2], inputs["past_key.0"][3]
    if "logits" in outputs and len(outputs["logits"]) == 3:
        found["vocab_size"] = outputs["logits"][2]
    if "hidden_states" in outputs and len(outputs["hidden_states"]) == 3:
        found["hidden_size"] = outputs["hidden_states"][2]
    for name, value in found.items():
        want = getattr(config, name)
        if value is not None and value != want:
            raise ManifestError(f"manifest key {key}.decoder_config.{name} is {want} but the graph {rel} has "
                                f"{value}; the manifest was edited or belongs to another bundle: recompile it")
