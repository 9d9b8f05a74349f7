"""A GGUF file's metadata checked against its own tensors, before transformers allocates anything.

transformers builds the model from the metadata (`block_count`, `embedding_length`, head counts ...) and
fills it from the tensors it finds, initialising the rest at random. So a header that lies (10^6 blocks,
zero heads, a string or NaN where a number belongs, an integer architecture) costs minutes and gigabytes or
raises deep inside transformers, and a file with a tensor missing compiles into noise. Here every size the
model is built from must be a positive integer that the file's tensors confirm; `missing_weights` (after
loading) refuses any parameter that did not come from the file.

    meta = check_gguf(path)   # GGUFMeta(architecture, block_count, hidden, ...) or CheckpointError
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrt.core.errors import CheckpointError

INT_TYPES = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"}
FLOAT_TYPES = {"FLOAT32", "FLOAT64"}
MAX_BLOCKS = 1024
MAX_SIZE = 1 << 24  # any width, head count or context length beyond this is not a real model
REQUIRED_INTS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                 "context_length")
OPTIONAL_INTS = ("attention.head_count_kv", "attention.key_length", "attention.value_length", "vocab_size",
                 "rope.dimension_count", "attention.sliding_window")
OPTIONAL_FLOATS = ("rope.freq_base", "attention.layer_norm_rms_epsilon")
BLOCK = re.compile(r"blk\.(\d+)\.")
TOKEN_ID = re.compile(r"tokenizer\.ggml\.\w+_token_id")  # bos, eos, unknown, padding, seperator (sic), eot ...


@dataclass(frozen=True)
class GGUFMeta:
    """The sizes a model is built from, confirmed by the file's tensors."""

    architecture: str
    block_count: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int


def _reader(path: Path) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises ValueError / struct / numpy errors on corrupt files
        raise CheckpointError(f"cannot read GGUF file {path.name}: {_why_unreadable(path, exc)}") from None


def _why_unreadable(path: Path, exc: Exception) -> str:
    """Say what is wrong with a file the `gguf` reader refused: its own message for a cut-short file is a numpy
    reshape/mmap error ("cannot reshape array of size 5360 into shape (128,68)"). Re-read only the header and
    compare the bytes its tensor table needs with the file's size."""
    import gguf
    import numpy as np

    size = path.stat().st_size
    if size == 0:
        return "the file is empty"
    if str(exc) == "GGUF magic invalid":
        with open(path, "rb") as f:
            if f.read(64).startswith(b"version https://git-lfs"):
                return "a Git LFS pointer, not the model file (fetch the file itself: git lfs pull)"
        return "not a GGUF file (it does not start with the GGUF magic bytes)"

    class HeaderOnly(gguf.GGUFReader):  # parses header, metadata and tensor table; maps no tensor data
        def _build_tensors(self, start: int, fields: list) -> None:
            ends = [0]
            for f in fields:
                dims, raw_type, offset = f.parts[3], f.parts[4], f.parts[5]
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_type[0]))]
                ends.append(start + int(offset[0]) + int(np.prod(dims.astype(np.uint64))) * type_size // block)
            self.needed = max(ends)

    try:
        needed = HeaderOnly(str(path)).needed
    except Exception:  # noqa: BLE001  (the header itself does not parse)
        return f"the file is truncated or corrupt: its header and metadata do not parse ({size:,} bytes; {exc})"
    if needed > size:
        return (f"the file is truncated: its tensor table needs {needed:,} bytes, the file has {size:,} (an "
                "interrupted download or copy?)")
    return str(exc)


def _value(reader: Any, key: str, kinds: set[str], path: Path) -> Any:
    """The scalar at `key` (None if absent); CheckpointError if it is not one value of `kinds`."""
    field = reader.fields.get(key)
    if field is None:
        return None
    types = [t.name for t in field.types]
    if len(types) != 1 or types[0] not in kinds or len(field.data) != 1:
        shown = "/".join(types) or "empty"
        raise CheckpointError(f"{path.name}: metadata {key} is {shown}, expected one "
                              f"{'integer' if kinds == INT_TYPES else 'number'}: the file is corrupt")
    value = field.parts[field.data[0]][0]
    return int(value) if kinds == INT_TYPES else float(value)


def _architecture(reader: Any, path: Path) -> str:
    field = reader.fields.get("general.architecture")
    if field is None or [t.name for t in field.types] != ["STRING"]:
        raise CheckpointError(f"{path.name}: metadata general.architecture is missing or not a string: the file is "
                              "not a model GGUF llama.cpp would load")
    try:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{path.name}: metadata general.architecture is not UTF-8") from None


def _ints(reader: Any, arch: str, path: Path) -> dict[str, int]:
    out = {}
    for key in REQUIRED_INTS + OPTIONAL_INTS:
        v = _value(reader, f"{arch}.{key}", INT_TYPES, path)
        if v is None:
            if key in REQUIRED_INTS:
                raise CheckpointError(f"{path.name}: metadata {arch}.{key} is missing")
            continue
        limit = MAX_BLOCKS if key == "block_count" else MAX_SIZE
        if not 1 <= v <= limit:
            raise CheckpointError(f"{path.name}: metadata {arch}.{key} = {v} is out of range [1, {limit}]: the file "
                                  "is corrupt")
        out[key] = v
    for key in OPTIONAL_FLOATS:
        v = _value(reader, f"{arch}.{key}", FLOAT_TYPES | INT_TYPES, path)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise CheckpointError(f"{path.name}: metadata {arch}.{key} = {v} must be a positive finite number")
    return out


def _token_ids(reader: Any, path: Path) -> None:
    """Every special token id (`tokenizer.ggml.*_token_id`) names an entry of the file's token list: transformers
    indexes the list with it (bos_token_id 2^31 was an IndexError)."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    count = len(tokens.data) if tokens is not None else 0
    for key in sorted(k for k in reader.fields if TOKEN_ID.fullmatch(k)):
        v = _value(reader, key, INT_TYPES, path)
        if not 0 <= v < count:
            raise CheckpointError(f"{path.name}: metadata {key} = {v} is out of range: the file lists {count} tokens "
                                  f"(ids 0 .. {count - 1}): the file is corrupt")


def _shape(tensors: dict[str, Any], name: str, path: Path) -> list[int]:
    if name not in tensors:
        raise CheckpointError(f"{path.name}: tensor {name} is missing: every weight must come from the file")
    return [int(d) for d in tensors[name].shape]  # GGUF order: [in, out]


def read_architecture(path: str | Path) -> str:
    """general.architecture of the GGUF file at `path` (CheckpointError unless it is a UTF-8 string)."""
    path = Path(path)
    return _architecture(_reader(path), path)


def check_gguf(path: str | Path) -> GGUFMeta:
    """Check the metadata of the GGUF file at `path` against its tensors (see the module docstring)."""
    path = Path(path)
    reader = _reader(path)
    arch = _architecture(reader, path)
    ints = _ints(reader, arch, path)
    _token_ids(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    blocks = {int(m.group(1)) for m in map(BLOCK.match, tensors) if m}
    n = ints["block_count"]
    if blocks != set(range(n)):
        raise CheckpointError(f"{path.name}: metadata says {n} blocks, the file holds tensors for {len(blocks)} "
                              f"(blk.0 .. blk.{max(blocks) if blocks else -1}): every weight must come from the file")
    hidden, heads = ints["embedding_length"], ints["attention.head_count"]
    kv_heads = ints.get("attention.head_count_kv", heads)
    head_dim = ints.get("attention.key_length", hidden // heads)
    expect = {"token_embd.weight": (0, hidden), "blk.0.attn_q.weight": (1, heads * head_dim),
              "blk.0.attn_k.weight": (1, kv_heads * head_dim),
              "blk.0.ffn_up.weight": (1, ints["feed_forward_length"])}
    for name, (axis, size) in expect.items():
        shape = _shape(tensors, name, path)
        if len(shape) < 2 or shape[axis] != size:
            raise CheckpointError(f"{path.name}: tensor {name} has shape {shape[::-1]}, the metadata implies "
                                  f"{size} along one axis: metadata and weights disagree")
    return GGUFMeta(arch, n, hidden, heads, kv_heads, head_dim)


def missing_weights(model: Any, loading_info: dict, path: Path) -> None:
    """After transformers loaded `model` from the GGUF at `path`: refuse parameters it initialised itself."""
    missing = set(loading_info.get("missing_keys") or ())
    if getattr(model.config, "tie_word_embeddings", False):
        missing.discard("lm_head.weight")
    if missing:
        shown = ", ".join(sorted(missing)[:3]) + (" ..." if len(missing) > 3 else "")
        raise CheckpointError(f"{path.name}: {len(missing)} weights the architecture needs are not in the file "
                              f"({shown}): refusing to compile random weights")
