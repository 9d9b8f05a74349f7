"""ONNX Runtime runner for the fused graph variant (compiler/fused_graph.py), CPU provider.

The KV cache is one [1, Hkv, capacity, D] buffer per layer for keys and one for values, bound once as
both `past_*` and `present_*`: GroupQueryAttention writes the S new rows at [P, P + S) in place and reads
rows [0, P + S). The past length reaches the op as `seqlens_k` / `total_sequence_length`, so rollback of
rejected drafts is `truncate(n)` (an integer store); token ids and lengths are written into bound memory (`_run`).
Logits are computed only for the rows asked for (`logit_positions`): every row for decode / verify, the
last row for prefill.

`min_rows` (a quantized target, see `Runner.min_rows`) is applied by `Runner.forward`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from specrt.bundle import graph_io
from specrt.runtime.backends.ort.layer_outputs import LayerOutputs
from specrt.bundle.graph_io import (LM_HEAD_FULL, LOGIT_POSITIONS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH, TREE_MASK,
                                    present_key, present_value)
from specrt.core.errors import BackendError, BackendUnavailable
from specrt.models.config import DecoderConfig
from specrt.runtime.kv_cache import KVCache
from specrt.runtime.backends.base import Runner
from specrt.runtime.backends.ort.runner import binding_runner, cpu_session, import_ort, one_line

PREFILL_ROWS = 256  # input_ids buffer kept for calls up to this many tokens (the loop's prefill chunk)


class HeadMajorKVCache(KVCache):
    """KVCache with the layout GroupQueryAttention reads: [1, Hkv, capacity, D] per layer (keys, values)."""

    seq_axis = 2

    def __init__(self, num_layers: int, capacity: int, kv_heads: int, head_dim: int) -> None:
        super().__init__(num_layers, capacity, kv_heads, head_dim,
                         lambda shape: np.zeros((shape[0], shape[2], shape[1], shape[3]), dtype=np.float32))


class OrtFusedRunner(Runner):
    name = "ort"
    native = ("_run_bound", "_binding", "_full_value", "_chain_value", "_tree_value", "session", "_logits",
              "_last_logits", "_hidden", "_rows", "_ids")

    def __init__(self, onnx_path: Path, config: DecoderConfig, capacity: int, max_short_tokens: int,
                 device: str = "cpu", threads: int | None = None, want_hidden: bool = False,
                 min_rows: int = 1, alternating: bool = False, session=None, cache: KVCache | None = None) -> None:
        """`session` / `cache` (optional): share another runner's session (one weights copy) and run on a KV
        region that the caller owns (runtime/batch/pool.py); by default the runner creates both."""
        ort = import_ort()
        if device != "cpu":
            raise BackendUnavailable(f"ort device {device!r}: the fused ONNX Runtime runner runs on the CPU")
        self.config = config
        self.min_rows = min_rows
        self.alternating = alternating  # another session runs between this one's runs (its pool stops spinning)
        max_short_tokens = max(max_short_tokens, min_rows)
        self.want_hidden = want_hidden
        self._ort = ort
        if session is None:
            self.session, opts = cpu_session(ort, onnx_path, threads, alternating)
            self.threads = opts.intra_op_num_threads
        else:
            self.session, self.threads = session, threads
        self.onnx_path = onnx_path
        self.cache = cache or HeadMajorKVCache(config.num_layers, capacity, config.num_kv_heads, config.head_dim)
        self.max_short = max_short_tokens
        v, h = config.vocab_size, config.hidden_size
        self._logits = np.empty((1, max_short_tokens, v), dtype=np.float32)  # [1, R, V] for decode / verify
        self._last_logits = np.empty((1, 1, v), dtype=np.float32)  # [1, 1, V] for prefill
        self._hidden = np.empty((1, max_short_tokens, h), dtype=np.float32)
        # a fused draft head's target layers (layer_outputs.py): joined to hidden_states
        self._layers = LayerOutputs.of(self.session, want_hidden, max_short_tokens, h)
        self.hidden_layers = self._layers.n if self._layers is not None else 0
        self._rows = np.arange(max(capacity, 1), dtype=np.int64)  # logit_positions source
        self._seqlens_k = np.zeros(1, dtype=np.int32)  # [1]
        self._total = np.zeros((), dtype=np.int32)  # []
        self._ids = np.zeros((1, max(max_short_tokens, PREFILL_ROWS)), dtype=np.int64)  # input_ids source
        self._binding = self.session.io_binding()
        self._bind_cache()
        self._binding.bind_cpu_input(SEQLENS_K, self._seqlens_k)  # bound once, updated in place
        self._binding.bind_cpu_input(TOTAL_SEQUENCE_LENGTH, self._total)
        # a screened LM head (compiler/lm_head_screen.py): its input, an overridable initializer (default true:
        # full rows), bound once as an OrtValue over this array and switched in place by set_argmax_only;
        # SPECRT_LM_HEAD_SCREEN=0 keeps the full head for every call
        self._full_rows = np.ones((), dtype=np.bool_)
        has_screen = LM_HEAD_FULL in {i.name for i in self.session.get_overridable_initializers()}
        self.screened = has_screen and os.environ.get("SPECRT_LM_HEAD_SCREEN", "1") != "0"
        if has_screen:
            self._full_value = ort.OrtValue.ortvalue_from_numpy(self._full_rows)
            self._binding.bind_ortvalue_input(LM_HEAD_FULL, self._full_value)
        # token trees (compiler/fused_tree.py): the graph's tree_mask input, an overridable initializer bound as an
        # OrtValue: the default [[True]] (a chain) for every call but a tree pass, which binds its [S, S] mask
        # A two-row target (int4 at accuracy level 4) verifies chains: its int8 activation quantization turns the
        # ~1e-8 rounding difference of a tree row's attention (its masked columns) into logits off by up to ~0.5 on
        # SmolLM2, so tree output would stop equalling plain decoding (docs/trees.md); SPECRT_TREES_INEXACT=1 opts in
        overridable = {i.name for i in self.session.get_overridable_initializers()}
        self.supports_tree = TREE_MASK in overridable and (min_rows == 1 or
                                                           os.environ.get("SPECRT_TREES_INEXACT") == "1")
        if self.supports_tree:
            self._chain_value = ort.OrtValue.ortvalue_from_numpy(np.ones((1, 1), dtype=np.bool_))
            self._binding.bind_ortvalue_input(TREE_MASK, self._chain_value)
        self._bound: tuple | None = None  # the call shape the token / row / output bindings are set for
        self._run_bound = binding_runner(self.session, self._binding)

    @property
    def tree_max_rows(self) -> int:
        """Most rows of a tree pass: a windowed graph's exact window holds for trees of at most min(window,
        TREE_WINDOW_SLACK) rows (compiler/fused_tree.py)."""
        from specrt.bundle.graph_io import TREE_WINDOW_SLACK

        windows = [w for w in (self.config.layer_window(i) for i in range(self.config.num_layers)) if w]
        return min([self.max_short] + [min(w, TREE_WINDOW_SLACK) for w in windows])

    def _forward_tree(self, token_ids: np.ndarray, past: int, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        if token_ids.size > self.tree_max_rows:
            raise BackendError(f"a tree of {token_ids.size} rows exceeds this graph's {self.tree_max_rows}")
        self._tree_value = self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(mask))
        self._binding.bind_ortvalue_input(TREE_MASK, self._tree_value)
        try:
            return self._forward(token_ids, past)
        finally:  # back to the chain default for every other call
            self._binding.bind_ortvalue_input(TREE_MASK, self._chain_value)

    def set_argmax_only(self, on: bool) -> None:
        self._full_rows[()] = not (on and self.screened)

    def _bind_cache(self) -> None:
        """Bind every layer's buffers as past and present once: they never move and never change shape (a
        pooled runner whose region moves binds again: runtime/batch/pool.py)."""
        b = self._binding
        for i, (k, v) in enumerate(zip(self.cache.keys, self.cache.values)):
            for name_in, name_out, buf in ((graph_io.past_key(i), present_key(i), k),
                                           (graph_io.past_value(i), present_value(i), v)):
                b.bind_input(name_in, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
                b.bind_output(name_out, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)

    def _run(self, token_ids: np.ndarray, p: int, row_start: int, rows: int, logits_buf: np.ndarray) -> None:
        """Run S tokens at past length p; logits of rows [row_start, row_start + rows) into logits_buf.

        Every buffer is bound by pointer and bound again only when the call's shape changes, so a decode
        step with the same shape as the last one (plain decoding, a fixed k) writes three numbers and the
        token ids into bound memory and runs: no binding calls and no allocation per step.
        """
        s = token_ids.size
        ids = self._ids if s <= self._ids.shape[1] else np.empty((1, s), dtype=np.int64)
        ids[0, :s] = token_ids
        self._seqlens_k[0] = p + s - 1
        self._total[()] = p + s
        hidden_buf = self._hidden if s <= self.max_short else np.empty((1, s, self.config.hidden_size), np.float32)
        # calls up to max_short tokens use only the runner's own buffers (ids, hidden, _logits / _last_logits)
        key = (s, row_start, rows, id(logits_buf)) if s <= self.max_short else None
        if key is None or key != self._bound:
            b = self._binding
            b.bind_cpu_input(graph_io.INPUT_IDS, ids[:, :s])
            b.bind_cpu_input(LOGIT_POSITIONS, self._rows[row_start:row_start + rows])
            b.bind_output(graph_io.LOGITS, "cpu", 0, np.float32, [1, rows, self.config.vocab_size],
                          logits_buf.ctypes.data)
            b.bind_output(graph_io.HIDDEN_STATES, "cpu", 0, np.float32, [1, s, self.config.hidden_size],
                          hidden_buf.ctypes.data)
            if self._layers is not None:
                self._layers_buf = self._layers.buffer(s)
                b.bind_output(graph_io.HIDDEN_LAYERS, "cpu", 0, np.float32, self._layers.shape(s),
                              self._layers_buf.ctypes.data)
            self._bound = key  # None after a one-off buffer (a long call): the next call binds again
        try:
            self._run_bound()
        except Exception as exc:
            raise BackendError(f"ONNX Runtime run failed on {self.onnx_path} (S={s}, P={p}): {one_line(exc)}") from None
        self.hidden_states = hidden_buf[0, :s] if self.want_hidden else None
        if self._layers is not None:
            self.hidden_states = LayerOutputs.join(hidden_buf[0], self._layers_buf, s)

    def _forward(self, token_ids: np.ndarray, past: int) -> np.ndarray:
        rows = token_ids.size
        buf = self._logits if rows <= self.max_short else np.empty((1, rows, self.config.vocab_size), np.float32)
        self._run(token_ids, past, 0, rows, buf)
        return buf[0, :rows]

    def _forward_last(self, token_ids: np.ndarray, past: int) -> np.ndarray:
        if token_ids.size <= self.max_short:  # a short call (a draft's catch-up): the decode bindings, no rebinding
            return self._forward(token_ids, past)[-1]
        self._run(token_ids, past, token_ids.size - 1, 1, self._last_logits)
        return self._last_logits[0, 0]

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "graph": "fused", "provider": self.session.get_providers()[0],
                "onnxruntime": self._ort.__version__, "threads": self.threads} | (
                    {"min_rows": self.min_rows} if self.min_rows > 1 else {}) | (
                    {"lm_head": "screened (greedy)"} if self.screened else {})
