"""Memory planning per model and device, and the `--gpu-memory-budget` check. Pure Python (no GPU).

Per model (all in bytes, b = bytes per element of the engine precision: 4 fp32, 2 fp16/bf16 and for the
activations and KV cache of int8 / fp8 / int4 engines, which compute in fp16 between their Q/DQ nodes):

    weights      ONNX external-data size * w / 4 (the bundle graph is fp32), or parameters * w, where w is b,
                 or 1 (int8, fp8) or 0.5 (int4) bytes per weight
    kv_cache     2 * layers * (max_seq_len + max_draft_tokens + 1) * kv_heads * head_dim * b
                 (keys + values, full context plus k + 1 rows of verify headroom)
    workspace    the engine's --workspace (manifest), else DEFAULT_WORKSPACE
    activations  estimate for the largest call S = min(max_seq_len, PREFILL_CHUNK_MAX):
                 S * vocab * 4                          logits (fp32)
               + S * hidden * b                         hidden_states output
               + S * (4 * hidden + 2 * intermediate) * b  one layer's q/k/v/o and MLP temporaries
               + heads * S * max_seq_len * 4            one layer's attention scores (fp32 softmax)
    total        the sum

A draft head (`draft_head`) is planned as one decoder layer of the target's shape with a V'-row LM head
(`head_config`); its engine (on the target's GPU) holds the trained weights in the engine precision and the
target's input embedding in fp16; without an engine it is a CPU row (ONNX Runtime).

It is an estimate (TensorRT's own activation memory depends on tactics), meant to catch plans that
cannot fit before spending minutes building engines.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from pathlib import Path
from typing import Any, Iterable, Mapping

from specrt.core.errors import CheckpointError, InvalidArgument
from specrt.bundle.profiles import PREFILL_CHUNK_MAX

DEFAULT_WORKSPACE = 1 << 30
DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2,
               "int8": 2, "fp8": 2, "int4": 2}  # Q/DQ engines: fp16 activations and KV cache
WEIGHT_BYTES = {"int8": 1, "fp8": 1, "int4": 0.5}
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """'20GiB' / '512MiB' / '4GB' / '1.5g' / '1048576' -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise InvalidArgument(f"size {text!r}: expected a number with an optional unit (e.g. 20GiB, 512MiB, 4GB)")
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def dtype_bytes(precision: str) -> int:
    if precision not in DTYPE_BYTES:
        raise InvalidArgument(f"precision {precision!r}: choose one of fp32, fp16, bf16, int8, fp8, int4")
    return DTYPE_BYTES[precision]


def weight_bytes(precision: str) -> float:
    """Bytes per weight in an engine of `precision` (int4: block scales not counted)."""
    return WEIGHT_BYTES.get(precision) or dtype_bytes(precision)


def kv_cache_bytes(c: Mapping[str, Any], max_seq_len: int, max_draft_tokens: int, b: int) -> int:
    return 2 * c["num_layers"] * (max_seq_len + max_draft_tokens + 1) * c["num_kv_heads"] * c["head_dim"] * b


def activation_bytes(c: Mapping[str, Any], max_seq_len: int, b: int) -> int:
    s = min(max_seq_len, PREFILL_CHUNK_MAX)
    return (s * c["vocab_size"] * 4 + s * c["hidden_size"] * b
            + s * (4 * c["hidden_size"] + 2 * c["intermediate_size"]) * b
            + c["num_heads"] * s * max_seq_len * 4)


def model_row(role: str, c: Mapping[str, Any], weights_bytes: int, precision: str, max_seq_len: int,
              max_draft_tokens: int, workspace: int | None = None, device: str = "cuda:0",
              max_batch: int = 1) -> dict[str, Any]:
    """One model's memory on one device; `max_batch` slots of KV cache (the batch runner's static blocks)."""
    b = dtype_bytes(precision)
    row = {"device": device, "model": role, "precision": precision, "weights_bytes": int(weights_bytes),
           "kv_cache_bytes": max_batch * kv_cache_bytes(c, max_seq_len, max_draft_tokens, b),
           "workspace_bytes": int(DEFAULT_WORKSPACE if workspace is None else workspace),
           "activation_bytes": activation_bytes(c, max_seq_len, b)}
    row["total_bytes"] = sum(v for k, v in row.items() if k.endswith("_bytes"))
    return row


def plan_from_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_device: dict[str, int] = {}
    for r in rows:
        per_device[r["device"]] = per_device.get(r["device"], 0) + r["total_bytes"]
    return {"rows": rows, "per_device": per_device}


def head_config(target_config: Mapping[str, Any], draft_vocab_size: int) -> dict[str, Any]:
    """The decoder-shaped config a draft head's memory is planned with: one layer of the target's architecture
    and an LM head over its V' tokens (its KV cache and activations follow from these)."""
    return {**target_config, "num_layers": 1, "vocab_size": draft_vocab_size}


def head_weight_count(target_config: Mapping[str, Any], trained: int, draft_vocab_size: int) -> tuple[int, int]:
    """(weights in the head engine's precision, fp16 embedding weights) of a draft head: the trained fc + layer,
    the final norm and the V' kept LM-head rows; and the input embedding (the target's whole table, kept in fp16
    in the head's graph: compiler/draft_head.py)."""
    hidden = target_config["hidden_size"]
    return trained + hidden + draft_vocab_size * hidden, target_config["vocab_size"] * hidden


def _head_row(manifest, n: int, k: int, devices: Mapping[str, str] | None, precision: str | None,
              workspace: int | None) -> dict[str, Any] | None:
    """The draft head's row: on the target's GPU when it has an engine (`engines.draft_head`), else on the CPU
    (ONNX Runtime; a quantized head keeps running there). Its weights: the graph's data as stored (an engine:
    scaled to the engine's precision; the fp16 embedding stays 2 bytes per weight, within a 4-byte graph)."""
    from specrt.bundle.graph_io import HEAD_ENGINE_ROLE

    head = manifest.draft_head
    if head is None:
        return None
    target = manifest.models["target"].decoder_config
    cfg = head_config(dataclasses.asdict(target), head.draft_vocab_size)
    files = [manifest.path(p) for p in (head.onnx, head.onnx_data) if p]
    stored = sum(f.stat().st_size for f in files if f.exists())
    eng = manifest.engines.get(HEAD_ENGINE_ROLE)
    if eng is None:  # ONNX Runtime on the CPU: fp32 activations, the graph's bytes as they are
        return model_row(HEAD_ENGINE_ROLE, cfg, stored, "fp32", n, k, 0, "cpu")
    prec = precision or eng.precision or "fp32"
    prec = prec if prec in ("fp32", "fp16", "bf16") else "fp16"  # beside Q/DQ engines the head's is fp16
    embed = target.vocab_size * target.hidden_size * 2  # the fp16 input embedding, as stored
    weights = int(max(stored - embed, 0) * weight_bytes(prec) / 4) + embed
    ws = workspace if workspace is not None else eng.workspace_bytes
    return model_row(HEAD_ENGINE_ROLE, cfg, weights, prec, n, k, ws, (devices or {}).get("target", "cuda:0"))


def memory_plan(manifest, max_seq_len: int | None = None, devices: Mapping[str, str] | None = None,
                precision: str | None = None, workspace: int | None = None) -> dict[str, Any]:
    """Plan for a bundle: {"rows": [...], "per_device": {device: bytes}}. `devices`: role -> "cuda:N".
    A draft head is a row of its own ("draft_head", `_head_row`)."""
    n = max_seq_len or manifest.max_seq_len
    k = manifest.max_draft_tokens
    rows = []
    for role, e in manifest.models.items():
        eng = manifest.engines.get(role)
        prec = precision or (eng.precision if eng else None) or e.dtype or "float32"
        data = manifest.path(e.onnx_data) if e.onnx_data and "portable" not in e.omitted else None  # lean: 4 B/param
        fp32_bytes = data.stat().st_size if data is not None and data.exists() else 4 * e.num_parameters
        weights = int(fp32_bytes * weight_bytes(prec) / 4)
        ws = workspace if workspace is not None else (eng.workspace_bytes if eng else None)
        rows.append(model_row(role, dataclasses.asdict(e.decoder_config), weights, prec, n, k, ws,
                              (devices or {}).get(role, "cuda:0")))
    head = _head_row(manifest, n, k, devices, precision, workspace)
    return plan_from_rows(rows + ([head] if head is not None else []))


def safetensors_parameters(files: Iterable[Path]) -> int:
    """Number of parameters in safetensors files, from their headers only (no weights are read)."""
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            try:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
            except (struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{f} is not a safetensors file: {exc}") from None
        for name, meta in header.items():
            if name != "__metadata__":
                count = 1
                for d in meta["shape"]:
                    count *= d
                total += count
    return total


def check_budget(plan: Mapping[str, Any], budget_bytes: int) -> None:
    """Raise InvalidArgument, with the numbers, when a device's planned total exceeds the budget."""
    over = {d: t for d, t in plan["per_device"].items() if t > budget_bytes}
    if not over:
        return
    parts = []
    for dev, total in over.items():
        rows = "; ".join(
            f"{r['model']}: weights {format_size(r['weights_bytes'])}, kv cache {format_size(r['kv_cache_bytes'])}, "
            f"workspace {format_size(r['workspace_bytes'])}, activations {format_size(r['activation_bytes'])}"
            for r in plan["rows"] if r["device"] == dev)
        parts.append(f"{dev} needs {format_size(total)} ({rows})")
    raise InvalidArgument(
        f"memory plan exceeds --gpu-memory-budget {format_size(budget_bytes)}: {' | '.join(parts)}. Fix: lower "
        "--max-seq-len, use --precision fp16 or bf16, a smaller --workspace, or put the draft on another GPU"
    )
