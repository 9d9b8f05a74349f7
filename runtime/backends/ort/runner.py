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

from specrt.bundle import graph_io
from specrt.runtime.backends.ort.layer_outputs import LayerOutputs
from specrt.bundle.graph_io import LOGIT_START
from specrt.core.errors import BackendError, BackendUnavailable
from specrt.core.text import one_line  # noqa: F401 - re-exported: the ORT backends' error messages
from specrt.models.config import DecoderConfig
from specrt.runtime.kv_cache import KVCache
from specrt.runtime.backends.base import Runner
# import_ort and default_threads are re-exported: the ONNX Runtime backends import them from here
from specrt.runtime.backends.ort.environment import default_threads, import_ort  # noqa: F401
from specrt.runtime.backends.ort.threads import on_shared_pool


def cpu_session(ort, onnx_path: Path, threads: int | None, alternating: bool = False):
    """(InferenceSession on the CPU provider, its SessionOptions) with specrt's thread settings.

    Pool threads spin-wait for work. `alternating`: another multi-threaded session (the draft) runs between this
    one's runs on the same cores, so both stop spinning when a run ends (`session.force_spinning_stop`); why and
    the measurements: docs/benchmarks.md, "Design note: CPU execution". SPECRT_ORT_SPIN=0 turns spinning off
    (a machine shared with other busy processes).
    """
    opts = session_options(ort, threads, alternating)
    try:
        return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"]), opts
    except Exception as exc:
        raise BackendError(f"ONNX Runtime could not load {onnx_path}: {one_line(exc)}") from None


def session_options(ort, threads: int | None, alternating: bool = False):
    """specrt's SessionOptions for the CPU provider (see `cpu_session`)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: the portable graph's defaulted logit_start input would warn on every load
    shared = on_shared_pool(opts)  # the process's one pool (threads.py): nothing spins against it
    if not shared:
        opts.intra_op_num_threads = threads or default_threads()
        opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Pre-pack constant weights (MatMulNBits' int4 blocks, fp32 GEMM panels) on the intra-op pool instead of one
    # thread: the same packed bytes, a faster cold start (docs/first-run.md, "Cold start").
    opts.add_session_config_entry("session.prepack.enable_parallel", "1")
    if os.environ.get("SPECRT_ORT_SPIN", "1") == "0":
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif alternating and not shared:
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    return opts


def small_session_options(ort, threads: int):
    """SessionOptions for a tiny model run a few rows at a time (Medusa heads, a draft head): `threads` threads, no
    spinning; on the process's shared pool when there is one (`threads.py`: then no session may have its own)."""
    opts = ort.SessionOptions()
    if not on_shared_pool(opts):
        opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


def binding_runner(session, binding):
    """A no-argument call running `session` on `binding`. The public `run_with_iobinding` adds a Python wrapper
    and a WebGPU graph-capture query per call, so the C-level session is called directly (the per-token cost
    outside ONNX Runtime: docs/benchmarks.md, "Design note: CPU execution"); the public API if a future
    onnxruntime moves these internals."""
    try:
        native_run, native_binding = session._sess.run_with_iobinding, binding._iobinding
    except AttributeError:
        return lambda: session.run_with_iobinding(binding)
    return lambda: native_run(native_binding, None)


class OrtRunner(Runner):
    name = "ort"
    native = ("_run_bound", "_bind_in", "_bind_out", "_binding", "_chain_value", "_tree_value", "session", "_logits",
              "_hidden", "_positions", "_key_ptrs", "_value_ptrs")

    def __init__(self, onnx_path: Path, config: DecoderConfig, capacity: int, max_short_tokens: int,
                 device: str = "cpu", threads: int | None = None, want_hidden: bool = False,
                 min_rows: int = 1, alternating: bool = False) -> None:
        ort = import_ort()
        if device != "cpu":
            raise BackendUnavailable(
                f"ort device {device!r}: the ONNX Runtime runner keeps its KV cache in host memory; use "
                "backend='ort-cuda' / 'ort-trt' (provider on GPU) or backend='trt'"
            )
        self.config = config
        self.min_rows = min_rows  # shorter decode / verify calls are padded (Runner.forward)
        max_short_tokens = max(max_short_tokens, min_rows)
        self.want_hidden = want_hidden
        self._ort = ort
        self.provider_request = "cpu"
        self.session, opts = cpu_session(ort, onnx_path, threads, alternating)
        self.onnx_path = onnx_path
        self.cache = KVCache(config.num_layers, capacity, config.num_kv_heads, config.head_dim,
                             lambda shape: np.zeros(shape, dtype=np.float32))
        self.max_short = max_short_tokens
        self._logits = np.empty((1, max_short_tokens, config.vocab_size), dtype=np.float32)
        self._hidden = np.empty((1, max_short_tokens, config.hidden_size), dtype=np.float32)
        self._binding = self.session.io_binding()
        self._bind_in, self._bind_out = self._fast_binders(ort)
        self._run_bound = binding_runner(self.session, self._binding)
        self._positions = np.arange(capacity, dtype=np.int64)[None, :]  # [1, capacity]
        self._key_ptrs = [k.ctypes.data for k in self.cache.keys]
        self._value_ptrs = [v.ctypes.data for v in self.cache.values]
        self._names = [(graph_io.past_key(i), graph_io.past_value(i), graph_io.new_key(i), graph_io.new_value(i))
                       for i in range(config.num_layers)]
        self.threads = opts.intra_op_num_threads
        # logit_start (compiler/logit_rows.py): defaults to 0 (every row); forward_last feeds S - 1
        overridable = {i.name for i in self.session.get_overridable_initializers()}
        self._has_logit_start = LOGIT_START in overridable
        self._output_names = graph_io.output_names(config.num_layers)
        # a fused draft head's target layers (layer_outputs.py): joined to hidden_states
        self._layers = LayerOutputs.of(self.session, want_hidden, max_short_tokens, config.hidden_size)
        self.hidden_layers = self._layers.n if self._layers is not None else 0
        if self._layers is not None:
            self._output_names = self._output_names + [graph_io.HIDDEN_LAYERS]
        # token trees (docs/trees.md): a portable graph compiled with the tree_mask input (default: the chain)
        self.supports_tree = graph_io.TREE_MASK in overridable
        if self.supports_tree:
            self._chain_value = ort.OrtValue.ortvalue_from_numpy(np.ones((1, 1), dtype=np.bool_))
            self._binding.bind_ortvalue_input(graph_io.TREE_MASK, self._chain_value)

    def _fast_binders(self, ort):
        """(bind_input, bind_output) taking (name, shape, pointer) for host float32 buffers.

        The public IOBinding methods rebuild an OrtDevice per call; with 4 bindings per layer per step
        that is a measurable share of a small model's step, so the C-level binding is used with a device
        made once. Falls back to the public API if a future onnxruntime moves these internals.
        """
        b = self._binding
        try:
            native, dev = b._iobinding, ort.OrtDevice.make("cpu", 0)._get_c_device()
            return (lambda n, shape, ptr: native.bind_input(n, dev, np.float32, shape, ptr),
                    lambda n, shape, ptr: native.bind_output(n, dev, np.float32, shape, ptr))
        except AttributeError:
            return (lambda n, shape, ptr: b.bind_input(n, "cpu", 0, np.float32, shape, ptr),
                    lambda n, shape, ptr: b.bind_output(n, "cpu", 0, np.float32, shape, ptr))

    def _forward_last(self, token_ids: np.ndarray, p: int) -> np.ndarray:
        """Prefill form: the graph computes one logits row (logit_start = S - 1). ONNX Runtime cannot
        IO-bind an input that has a default initializer, so this call feeds arrays instead: the past is
        passed as views of the cache and only the S new K/V rows are copied in afterwards."""
        if not self._has_logit_start:  # a bundle written before logit_start existed
            return self._forward(token_ids, p)[-1]
        s = token_ids.size
        feeds = {graph_io.INPUT_IDS: np.ascontiguousarray(token_ids, dtype=np.int64)[None, :],
                 graph_io.POSITION_IDS: self._positions[:, p:p + s],
                 LOGIT_START: np.array([s - 1], dtype=np.int64)}
        for i, (k, v) in enumerate(zip(self.cache.keys, self.cache.values)):
            feeds[self._names[i][0]], feeds[self._names[i][1]] = k[:, :p], v[:, :p]
        try:
            logits, hidden, *new_kv = self.session.run(self._output_names, feeds)
            if self._layers is not None:
                layers = new_kv.pop()
        except Exception as exc:
            raise BackendError(f"ONNX Runtime run failed on {self.onnx_path} (S={s}, P={p}): {one_line(exc)}") from None
        for i, (k, v) in enumerate(zip(self.cache.keys, self.cache.values)):
            k[:, p:p + s], v[:, p:p + s] = new_kv[2 * i], new_kv[2 * i + 1]
        self.hidden_states = hidden[0] if self.want_hidden else None
        if self._layers is not None:
            self.hidden_states = LayerOutputs.join(hidden[0], layers, s)
        return logits[0, -1]

    def _forward_tree(self, token_ids: np.ndarray, past: int, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        self._tree_value = self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(mask))
        self._binding.bind_ortvalue_input(graph_io.TREE_MASK, self._tree_value)
        try:
            return self._forward(token_ids, past, positions[None, :])
        finally:  # back to the chain default
            self._binding.bind_ortvalue_input(graph_io.TREE_MASK, self._chain_value)

    def _forward(self, token_ids: np.ndarray, p: int, positions: np.ndarray | None = None) -> np.ndarray:
        s = token_ids.size
        b = self._binding
        b.bind_cpu_input(graph_io.INPUT_IDS, np.ascontiguousarray(token_ids, dtype=np.int64)[None, :])
        b.bind_cpu_input(graph_io.POSITION_IDS, self._positions[:, p:p + s] if positions is None else positions)
        kv_past, kv_new = [1, p, *self.cache.row_shape], [1, s, *self.cache.row_shape]
        offset = self.cache.row_offset(p)
        for i in range(self.config.num_layers):
            k_ptr, v_ptr = self._key_ptrs[i], self._value_ptrs[i]
            self._bind_in(self._names[i][0], kv_past, k_ptr)
            self._bind_in(self._names[i][1], kv_past, v_ptr)
            self._bind_out(self._names[i][2], kv_new, k_ptr + offset)
            self._bind_out(self._names[i][3], kv_new, v_ptr + offset)
        v, h = self.config.vocab_size, self.config.hidden_size
        if s <= self.max_short:
            logits_buf, hidden_buf = self._logits, self._hidden
        else:  # prefill: a one-off buffer (the loop prefills in chunks, so this stays bounded)
            logits_buf = np.empty((1, s, v), dtype=np.float32)
            hidden_buf = np.empty((1, s, h), dtype=np.float32)
        self._bind_out(graph_io.LOGITS, [1, s, v], logits_buf.ctypes.data)
        self._bind_out(graph_io.HIDDEN_STATES, [1, s, h], hidden_buf.ctypes.data)
        if self._layers is not None:
            layers_buf = self._layers.buffer(s)
            self._bind_out(graph_io.HIDDEN_LAYERS, self._layers.shape(s), layers_buf.ctypes.data)
        try:
            self._run_bound()
        except Exception as exc:
            raise BackendError(f"ONNX Runtime run failed on {self.onnx_path} (S={s}, P={p}): {one_line(exc)}; "
                               "if the bundle's manifest was edited, recompile it") from None
        self.hidden_states = hidden_buf[0, :s] if self.want_hidden else None
        if self._layers is not None:
            self.hidden_states = LayerOutputs.join(hidden_buf[0], layers_buf, s)
        return logits_buf[0, :s]

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "provider": self.session.get_providers()[0],
                "onnxruntime": self._ort.__version__, "threads": self.threads}
