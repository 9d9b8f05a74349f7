"""What `load` verifies in a manifest before any backend runs (README "Safety"), beyond checksums.

* Structure and values (on construction of the schema dataclasses, schema.py / entries.py / parts.py):
  types, ranges and consistency (`max_seq_len` against the recorded profiles, the
  decoder config against the ONNX graph's inputs and outputs), each failure a `ManifestError` naming
  the key.
* Files: the file list is non-empty; every path the manifest references (graphs, their external data,
  configs, tokenizer, engines) is listed, so it is checksummed; every listed path resolves (symlinks
  followed) inside the bundle root.
* Memory: the KV cache that `max_seq_len` and the decoder config imply must fit in available memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from specrt.core.errors import BundleError, ManifestError
from specrt.bundle.paths import resolve_inside

if TYPE_CHECKING:
    from specrt.bundle.schema import Manifest


# ---------------------------------------------------------------------------------------- values
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


def check_memory(manifest: "Manifest") -> None:
    """The KV caches `load` preallocates must fit in available memory (no MemoryError mid-load)."""
    import psutil

    total = 0
    for entry in manifest.models.values():
        c = entry.decoder_config
        total += 2 * c.num_layers * manifest.max_seq_len * c.num_kv_heads * c.head_dim * 4
    available = psutil.virtual_memory().available
    if total > available:
        raise ManifestError(f"manifest max_seq_len {manifest.max_seq_len} needs {total / 2**30:.1f} GiB of KV cache, "
                            f"{available / 2**30:.1f} GiB are available")


# ----------------------------------------------------------------------------------------- files
def check_file_list(files: Any, referenced: Mapping[str, str]) -> None:
    """The file list is non-empty and lists every path the manifest references (`referenced`: key -> path)."""
    if not isinstance(files, Mapping) or not files:
        raise ManifestError("manifest has no file list ('files' is empty): nothing could be verified; "
                            "recompile the bundle")
    for key, rel in referenced.items():
        if not isinstance(rel, str) or rel not in files:
            raise ManifestError(f"manifest key {key} names {rel!r}, which is not in the manifest's file list "
                                "(unverified files are not opened); recompile the bundle")


def check_graphs(root: Path, manifest: "Manifest") -> None:
    """Every external-data file an ONNX graph names is listed (and so verified) and inside the bundle, and
    each decoder graph has the layers and vocabulary its manifest entry says."""
    import onnx

    for key, rel in manifest.graph_files().items():
        try:
            model = onnx.load_model(str(resolve_inside(root, rel)), load_external_data=False)
        except BundleError:
            raise
        except Exception as exc:  # protobuf's DecodeError and friends
            raise BundleError(f"bundle file {rel} is not a readable ONNX graph ({type(exc).__name__}); "
                              "recompile the bundle") from None
        if key.startswith("models."):
            check_graph_shapes(model, manifest.models[key.split(".", 1)[1]].decoder_config, key, rel)
        folder = Path(rel).parent
        locations = {entry.value for t in model.graph.initializer for entry in t.external_data
                     if entry.key == "location"}
        for loc in locations:
            ref = (folder / loc).as_posix()
            if ".." in Path(loc).parts or Path(loc).is_absolute() or ref not in manifest.files:
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
