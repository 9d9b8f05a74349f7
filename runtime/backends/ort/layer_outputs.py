"""The target graph's `hidden_layers` output (a bundle with a fused draft head, compiler/feature_layers.py), bound
next to `hidden_states` by the ONNX Runtime runners and joined to it.

A runner created with `want_hidden=True` on such a graph hands the proposers `hidden_states` [S, (1 + n) * D]: the
final feature in the first D columns (what a plain head or Medusa reads) and the residual stream after each of
the head's n layers after it (the fused head's proposer splits them, runtime/proposers/head.py). So the loop, the
tree path's row selection and the proposer contract see one array as before.
"""

from __future__ import annotations

import numpy as np

from specrt.bundle.graph_io import HIDDEN_LAYERS


class LayerOutputs:
    """Buffers [1, rows, n, D] for `hidden_layers`; `of` gives None where there is nothing to bind."""

    def __init__(self, n: int, max_rows: int, hidden_size: int) -> None:
        self.n, self.hidden_size = n, hidden_size
        self._buf = np.empty((1, max_rows, n, hidden_size), dtype=np.float32)

    @classmethod
    def of(cls, session, want_hidden: bool, max_rows: int, hidden_size: int) -> "LayerOutputs | None":
        if not want_hidden:
            return None
        out = next((o for o in session.get_outputs() if o.name == HIDDEN_LAYERS), None)
        if out is None:
            return None
        n = out.shape[2]
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{HIDDEN_LAYERS} output has shape {out.shape}: expected [B, S, n, hidden] with n fixed")
        return cls(n, max_rows, hidden_size)

    def buffer(self, s: int) -> np.ndarray:
        """[1, s, n, D]: the runner's own buffer, or a one-off for a long call (a prefill chunk)."""
        if s <= self._buf.shape[1]:
            return self._buf
        return np.empty((1, s, self.n, self.hidden_size), dtype=np.float32)

    def shape(self, s: int) -> list[int]:
        return [1, s, self.n, self.hidden_size]

    @staticmethod
    def join(hidden: np.ndarray, layers: np.ndarray, s: int) -> np.ndarray:
        """hidden [S, D] + layers [1, >=S, n, D] -> [S, (1 + n) D] (a copy: valid after the next call)."""
        return np.concatenate((hidden[:s], layers[0, :s].reshape(s, -1)), axis=1)
