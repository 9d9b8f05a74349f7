"""`FusedScorer`: the fused graph (compiler/fused_graph.py) behind the `GraphScorer` interface of quality.py.

The fused graph keeps its KV cache in one [1, Hkv, C, D] buffer per layer, written in place at rows
[P, P + S). A "past" here is just its length P over the scorer's own buffers: `run(ids, past)` writes rows
[P, P + S) and returns the past P + S. A past stays usable as long as no later call started at a smaller
length wrote over its rows, which is how quality.py uses pasts (each window from an empty past; a verify pass
and then one-token passes from the same past, each one-token pass rewriting the row the verify wrote).
`min_rows` pads shorter calls with their last token, as the runner does for a level-4 target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.bundle.graph_io import pad_rows
from specrt.compiler.fused_validate import run_fused
from specrt.compiler.quality import scorer_session


class FusedScorer:
    """One ONNX Runtime CPU session over a fused graph; `run` computes logits for every new row."""

    def __init__(self, onnx_path: Path, dims: dict[str, int], capacity: int, threads: int | None = None,
                 min_rows: int = 1) -> None:
        self.session = scorer_session(onnx_path, threads)
        shape = (1, dims["num_kv_heads"], capacity, dims["head_dim"])
        self.keys = [np.zeros(shape, np.float32) for _ in range(dims["num_layers"])]
        self.values = [np.zeros(shape, np.float32) for _ in range(dims["num_layers"])]
        self.capacity = capacity
        self.min_rows = min_rows  # pad shorter calls like the runners do (Runner.forward)

    def empty_past(self) -> int:
        return 0

    def run(self, ids: np.ndarray, past: int, last_only: bool = False) -> tuple[np.ndarray, int]:
        """Logits [S, V] for `ids` [S] after `past` rows (or [1, V]: the last row, the prefill form), and the
        new past length."""
        if past + ids.size > self.capacity:
            raise ValueError(f"{past} + {ids.size} rows exceed the scorer's capacity {self.capacity}")
        s = ids.size
        if not last_only and past + self.min_rows <= self.capacity:
            ids = pad_rows(ids, self.min_rows)
        rows = np.arange(s - 1 if last_only else 0, ids.size, dtype=np.int64)
        logits, _ = run_fused(self.session, ids[None].astype(np.int64), rows, self.keys, self.values, past)
        return logits[0, :1 if last_only else s], past + s
