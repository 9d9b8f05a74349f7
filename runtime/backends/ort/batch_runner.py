"""`OrtBatchRunner`: the batched portable graph on ONNX Runtime's CPU provider (runtime/backends/batch.py).

The reference implementation of the batch-runner contract: the same graph, static slot cache, padding and
commit rules the TensorRT batch runner uses on a GPU, run here on real ONNX Runtime sessions so that every test
of the contract executes. (Continuous batching on the CPU runs the fused graph instead: runtime/batch/.)
ONNX Runtime cannot IO-bind an input that has a default initializer (`past_lengths` has one), so each pass feeds
arrays: the past as views of the slot buffers (no copy), the new rows returned by ONNX Runtime and copied in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import PAST_LENGTHS
from specrt.core.errors import BackendError, BundleError
from specrt.models.config import DecoderConfig
from specrt.runtime.backends.batch import BatchRunner
from specrt.runtime.backends.ort.runner import cpu_session, import_ort, one_line


class OrtBatchRunner(BatchRunner):
    name = "ort-portable"

    def __init__(self, onnx_path: Path, config: DecoderConfig, max_batch: int, max_seq_len: int,
                 threads: int | None = None, want_hidden: bool = False) -> None:
        super().__init__(config, max_batch, max_seq_len)
        ort = import_ort()
        self.session, opts = cpu_session(ort, onnx_path, threads)
        names = {i.name for i in self.session.get_inputs()} | {i.name for i in self.session.get_overridable_initializers()}
        if PAST_LENGTHS not in names:
            raise BundleError(f"{onnx_path} has no {PAST_LENGTHS} input: its portable graph predates batched "
                              "passes; recompile the bundle to run several sequences per pass")
        self.onnx_path, self.want_hidden, self.threads = onnx_path, want_hidden, opts.intra_op_num_threads
        c = config
        shape = (max_batch, self.past_rows, c.num_kv_heads, c.head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(c.num_layers)]  # L x [max_batch, P, Hkv, D]
        self.values = [np.zeros(shape, np.float32) for _ in range(c.num_layers)]
        self._output_names = graph_io.output_names(c.num_layers)
        self._new: list[np.ndarray] = []  # 2L x [B, S, Hkv, D] of the last pass

    def _run(self, ids: np.ndarray, positions: np.ndarray, lengths: np.ndarray, first: int = 0) -> np.ndarray:
        b = ids.shape[0]
        feeds = {graph_io.INPUT_IDS: ids, graph_io.POSITION_IDS: positions, PAST_LENGTHS: lengths}
        for i in range(self.config.num_layers):
            feeds[graph_io.past_key(i)] = self.keys[i][first:first + b]
            feeds[graph_io.past_value(i)] = self.values[i][first:first + b]
        try:
            logits, hidden, *self._new = self.session.run(self._output_names, feeds)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime batched pass failed on {self.onnx_path} (B={b}, S={ids.shape[1]}): "
                               f"{one_line(exc)}") from None
        return logits, hidden if self.want_hidden else None

    def _commit(self, slots: np.ndarray, rows: np.ndarray, staged_slots: np.ndarray, src: np.ndarray) -> None:
        for cache, staged in zip((c for kv in zip(self.keys, self.values) for c in kv), self._new):
            cache[slots, rows] = staged[staged_slots, src]

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"provider": self.session.get_providers()[0], "threads": self.threads}
