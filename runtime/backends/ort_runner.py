"""ONNX Runtime runner: the embedded default (CPU provider), or CUDA / TensorRT providers via onnxruntime-gpu.

Every call goes through IOBinding: the `past_*` inputs are bound to the first P rows of the KV buffers
and the `new_*` outputs directly to rows [P, P + S) of the same buffers, so ONNX Runtime writes the new
keys/values in place and nothing proportional to the context is copied. Logits for short calls (decode,
verify) land in a preallocated buffer; long calls (prefill) let ONNX Runtime allocate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...compiler import graph_io
from ...errors import BackendError, BackendUnavailable
from ...models.config import DecoderConfig
from ..kv_cache import KVCache
from .base import Runner

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "trt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}


def import_ort():
    try:
        import onnxruntime as ort
    except ImportError:
        raise BackendUnavailable(
            "ONNX Runtime is not installed: pip install 'specrt[cpu]' (or 'specrt[gpu]' on NVIDIA GPUs)"
        ) from None
    check_single_ort_distribution()
    return ort


def check_single_ort_distribution() -> None:
    """onnxruntime and onnxruntime-gpu share one directory; both installed is a broken environment."""
    from importlib import metadata

    found = []
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.version(dist)
            found.append(dist)
        except metadata.PackageNotFoundError:
            pass
    if len(found) > 1:
        raise BackendUnavailable(
            "both onnxruntime and onnxruntime-gpu are installed; they overwrite each other. Fix: "
            "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'specrt[cpu]' (or 'specrt[gpu]')"
        )


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class OrtRunner(Runner):
    name = "ort"

    def __init__(self, onnx_path: Path, config: DecoderConfig, capacity: int, max_short_tokens: int,
                 device: str = "cpu", threads: int | None = None, want_hidden: bool = False) -> None:
        ort = import_ort()
        if device != "cpu":
            raise BackendUnavailable(
                f"ort device {device!r}: the ONNX Runtime runner keeps its KV cache in host memory; use "
                "backend='ort-cuda' / 'ort-trt' (provider on GPU) or backend='trt'"
            )
        self.config = config
        self.want_hidden = want_hidden
        self._ort = ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or default_threads()
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.provider_request = "cpu"
        try:
            self.session = ort.InferenceSession(str(onnx_path), opts, providers=PROVIDERS["cpu"])
        except Exception as exc:
            raise BackendError(f"ONNX Runtime could not load {onnx_path}: {exc}") from None
        self.cache = KVCache(config.num_layers, capacity, config.num_kv_heads, config.head_dim,
                             lambda shape: np.zeros(shape, dtype=np.float32))
        self.max_short = max_short_tokens
        self._logits = np.empty((1, max_short_tokens, config.vocab_size), dtype=np.float32)
        self._hidden = np.empty((1, max_short_tokens, config.hidden_size), dtype=np.float32)
        self._row_bytes = config.num_kv_heads * config.head_dim * 4
        self._binding = self.session.io_binding()
        self._positions = np.arange(capacity, dtype=np.int64)[None, :]  # [1, capacity]
        self.threads = opts.intra_op_num_threads

    def _bind_rows(self, bind, name: str, buf: np.ndarray, start: int, rows: int) -> None:
        c = self.config
        bind(name, "cpu", 0, np.float32, [1, rows, c.num_kv_heads, c.head_dim],
             buf.ctypes.data + start * self._row_bytes)

    def forward(self, token_ids: np.ndarray) -> np.ndarray:
        self.check(token_ids)
        s, p = token_ids.size, self.cache.length
        b = self._binding
        b.bind_cpu_input(graph_io.INPUT_IDS, np.ascontiguousarray(token_ids, dtype=np.int64)[None, :])
        b.bind_cpu_input(graph_io.POSITION_IDS, self._positions[:, p:p + s])
        for i in range(self.config.num_layers):
            self._bind_rows(b.bind_input, graph_io.past_key(i), self.cache.keys[i], 0, p)
            self._bind_rows(b.bind_input, graph_io.past_value(i), self.cache.values[i], 0, p)
            self._bind_rows(b.bind_output, graph_io.new_key(i), self.cache.keys[i], p, s)
            self._bind_rows(b.bind_output, graph_io.new_value(i), self.cache.values[i], p, s)
        v, h = self.config.vocab_size, self.config.hidden_size
        if s <= self.max_short:
            logits_buf, hidden_buf = self._logits, self._hidden
        else:  # prefill: a one-off buffer (the loop prefills in chunks, so this stays bounded)
            logits_buf = np.empty((1, s, v), dtype=np.float32)
            hidden_buf = np.empty((1, s, h), dtype=np.float32)
        b.bind_output(graph_io.LOGITS, "cpu", 0, np.float32, [1, s, v], logits_buf.ctypes.data)
        b.bind_output(graph_io.HIDDEN_STATES, "cpu", 0, np.float32, [1, s, h], hidden_buf.ctypes.data)
        try:
            self.session.run_with_iobinding(b)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime run failed (S={s}, P={p}): {exc}") from None
        self.cache.length = p + s
        self.hidden_states = hidden_buf[0, :s] if self.want_hidden else None
        return logits_buf[0, :s]

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "provider": self.session.get_providers()[0],
                "onnxruntime": self._ort.__version__, "threads": self.threads}
