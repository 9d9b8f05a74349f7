"""The draft head's ONNX Runtime runner: its graph (`draft_head/head.onnx`) and its own KV cache.

`HeadRunner` is also the contract of the head's TensorRT runner (trt/head_runner.py, a subclass running the
bundle's head engine); runtime/backends/head.py picks one for a generator.
"""

from __future__ import annotations

import numpy as np

from specrt.bundle.graph_io import HEAD_INPUTS, LAYER_FEATURES
from specrt.bundle.head_vocab import head_vocab_ids
from specrt.core.errors import BackendUnavailable, InvalidArgument
from specrt.runtime.backends.ort.runner import import_ort, small_session_options

INPUTS = HEAD_INPUTS  # a fused head's graph also takes LAYER_FEATURES (FUSED_HEAD_INPUTS)


class HeadRunner:
    """The draft head's KV cache [1, capacity, Hkv, D] and its calls; the graph runs in `_run`: ONNX Runtime's CPU
    provider here, a TensorRT engine in `TrtHeadRunner` (trt/head_runner.py). A call of more rows
    than `max_rows` (an engine's largest profile) runs as several calls in order: the head's attention is
    causal, so each chunk reads the rows before it from the cache, as one call would.

    A fused head (`draft_head.feature_layers`, n layers) also reads the target's layers: rows of the target's
    features come as [S, (1 + n) D] (the target runner's hidden_states: the final feature, then the n layers,
    runtime/backends/ort/layer_outputs.py) and are split here into `features` and `layer_features [1, S, n, D]`;
    the head's own rows ([S, D], its fed-back feature) get zeros for the layers, as in training
    (recipes/head_ttt.py: depth > 0 reads no layer features)."""

    max_rows: int | None = None  # None: any number of rows per call

    def __init__(self, manifest, capacity: int, threads: int = 1) -> None:
        # [V'] logit index -> token id, checked against the manifest and the target (specrt/models/head_config.py)
        self.vocab_ids = np.asarray(head_vocab_ids(manifest), dtype=np.int64)
        self.capacity = capacity
        self.length = 0
        layers = manifest.draft_head.feature_layers
        self.num_layers = len(layers) if layers else 0  # a fused head's target layers (0: a plain head)
        self.hidden_size = manifest.draft_head.hidden_size
        self._open(manifest, capacity, threads)

    def _open(self, manifest, capacity: int, threads: int) -> None:
        try:
            ort = import_ort()
        except BackendUnavailable as exc:
            raise BackendUnavailable(f"the draft head runs on ONNX Runtime: {exc}") from None
        entry = manifest.draft_head
        opts = small_session_options(ort, threads)  # a few rows per call: one thread, no pool to wake
        self.session = ort.InferenceSession(str(manifest.path(entry.onnx)), opts, providers=["CPUExecutionProvider"])
        shape = (1, capacity, entry.num_kv_heads, entry.head_dim)
        self.keys = np.zeros(shape, dtype=np.float32)
        self.values = np.zeros(shape, dtype=np.float32)
        self._ids = np.empty((1, capacity), dtype=np.int64)

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def close(self) -> None:
        """Release the session (a TensorRT head: its contexts, then its engine) and the cache (idempotent); the
        Generator closes it with its runners."""
        for name in ("contexts", "engine", "_runtime", "session", "keys", "values"):
            if name in self.__dict__:
                setattr(self, name, None)
        self.length = 0

    def __call__(self, features: np.ndarray, token_ids: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
        """features [S, D] (a fused head: or [S, (1 + n) D], see the class), token_ids [S] at positions
        [position, position + S) -> (logits [S, V'], hidden [S, D])."""
        p, s = self.length, token_ids.size
        d = self.hidden_size
        if features.shape[-1] not in (d, (1 + self.num_layers) * d):
            raise InvalidArgument(f"draft head features have {features.shape[-1]} columns, expected {d}"
                                  + (f" or {(1 + self.num_layers) * d}" if self.num_layers else ""))
        if p + s > self.capacity:
            raise InvalidArgument(f"draft head cache full: {p} + {s} rows > capacity {self.capacity}")
        step = self.max_rows or s
        outs = []
        for a in range(0, s, step):
            b = min(s, a + step)
            outs.append(self._run(features[a:b], token_ids[a:b], position + a, self.length))
            self.length += b - a
        if len(outs) == 1:
            return outs[0]
        return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs])

    def _run(self, features: np.ndarray, token_ids: np.ndarray, position: int, p: int
             ) -> tuple[np.ndarray, np.ndarray]:
        """One graph call: S rows after the P cached ones; writes their keys / values at rows [P, P + S)."""
        s, d = token_ids.size, self.hidden_size
        self._ids[0, :s] = token_ids
        feeds = dict(zip(INPUTS, (np.ascontiguousarray(features[:, :d], dtype=np.float32)[None], self._ids[:, :s],
                                  np.arange(position, position + s, dtype=np.int64)[None],
                                  self.keys[:, :p], self.values[:, :p])))
        if self.num_layers:  # the target's layers on its rows, zeros on the head's own (see the class)
            layers = np.zeros((1, s, self.num_layers, d), np.float32)
            if features.shape[-1] > d:
                layers[0] = features[:, d:].reshape(s, self.num_layers, d)
            feeds[LAYER_FEATURES] = layers
        logits, hidden, k, v = self.session.run(None, feeds)
        self.keys[:, p:p + s], self.values[:, p:p + s] = k, v
        return logits[0], hidden[0]
