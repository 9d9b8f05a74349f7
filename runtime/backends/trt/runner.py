"""TensorRT runner: the bundle's engine for one model, one execution context per optimization profile.

Same contract and KV layout as the ONNX Runtime runner (runtime/kv_cache.py, prefix-bound): per layer a
device buffer [1, capacity, kv_heads, head_dim]; `past_*` is bound to rows [0, P) and `new_*` to rows
[P, P + S) of the same buffer, so TensorRT writes the new keys/values in place (no copy proportional
to the context; rollback = truncate). Per call: shapes are checked against the manifest's profiles in
Python (InvalidArgument), the context of the matching phase gets `set_input_shape` / `set_tensor_address`
(every False -> BackendError naming the call), one `execute_async_v3` on the runner's CUDA stream, and
one device-to-host copy of the logits. Only token ids go in and logits (and hidden states) come out.

The contexts share one scratch buffer (USER_MANAGED allocation; calls never overlap on one stream).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.profiles import phase_in_profiles
from specrt.core.trt import INSTALL_HINT, cuda_device_error, import_trt, installed_facts, make_logger, trt_import_error
from specrt.runtime.backends.trt.compat import check_call, check_engine_entry, engine_from_bytes
from specrt.core.errors import BackendError, BackendUnavailable, BundleError, InvalidArgument, SpecrtError
from specrt.models.config import DecoderConfig
from specrt.runtime.kv_cache import KVCache
from specrt.runtime.backends.base import Runner


def trt_unavailable_reason(manifest, device: str = "cuda:0") -> str | None:
    """Why the bundle's engines cannot run here (one line), or None when they can."""
    reason = trt_import_error() or cuda_device_error(device)
    if reason:
        return reason
    engines = manifest.engines
    missing = [role for role in manifest.models if role not in engines]
    if missing:
        return f"the bundle has no TensorRT engine for {', '.join(missing)} (compile with --engines trt)"
    try:
        facts = installed_facts(device)
        for role, entry in engines.items():
            check_engine_entry(role, entry, facts)
    except SpecrtError as exc:
        return str(exc)
    return None


class TrtEngine:
    """The part both TensorRT runners share (this one and trt/batch_runner.py): the checked engine of one model,
    its CUDA stream and one execution context per optimization profile (a shared scratch buffer)."""

    def _open_engine(self, manifest, role: str, config: DecoderConfig, device: str, want_hidden: bool,
                     engine_from: "TrtEngine | None" = None):
        """Deserialize and check `role`'s engine (or take `engine_from`'s, when that runner holds the same engine
        file on the same device: one copy of the weights); returns the tensorrt module and the torch dtype of its
        KV."""
        self.config, self.want_hidden = config, want_hidden
        self.profiles = manifest.models[role].profiles  # {phase: {input: {min, opt, max}}}
        trt = self._load_plan(manifest, role, device, self._check_io, engine_from)
        dtype = {"fp32": self._torch.float32, "fp16": self._torch.float16,
                 "bf16": self._torch.bfloat16}[self.entry.precision]
        return trt, dtype

    def _load_plan(self, manifest, role: str, device: str, check_io: Callable[[Any, str], None],
                   engine_from: "TrtEngine | None" = None):
        """The engine `engines.<role>` checked against the installed TensorRT and GPU, its I/O checked by
        `check_io(trt, role)`, a CUDA stream and one execution context per profile the entry lists, in order."""
        import torch

        trt = import_trt()
        reason = cuda_device_error(device)
        if reason:
            raise BackendUnavailable(f"backend 'trt' needs an NVIDIA GPU: {reason}; {INSTALL_HINT}")
        entry = manifest.engines.get(role)
        if entry is None:
            raise BundleError(f"the bundle has no TensorRT engine for {role}: recompile with --engines trt")
        self.device = torch.device(device)
        check_engine_entry(role, entry, installed_facts(device))
        self.entry, self._torch = entry, torch
        self._log: list[str] = []
        with torch.cuda.device(self.device):
            self._logger = make_logger(trt, self._log)
            self._runtime = trt.Runtime(self._logger)
            if entry.version_compatible:  # the plan carries its own lean runtime (host code)
                self._runtime.engine_host_code_allowed = True
            same = (isinstance(engine_from, TrtEngine) and getattr(engine_from, "entry", None) is not None
                    and engine_from.entry.path == entry.path and engine_from.device == self.device)
            if same:
                self.engine = engine_from.engine  # contexts below are this runner's own
            else:
                blob = manifest.path(entry.path).read_bytes()
                self.engine = engine_from_bytes(self._runtime, blob, role, self._log)
            check_io(trt, role)
            self.stream = torch.cuda.Stream(self.device)
            self.contexts = self._create_contexts(trt, list(entry.profiles))
        return trt

    def _check_io(self, trt, role: str) -> None:
        names = {self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)}
        n = self.config.num_layers
        expected = set(graph_io.input_names(n)) | set(graph_io.output_names(n))
        self.has_past_lengths = graph_io.PAST_LENGTHS in names  # engines built from the batched portable graph
        self.has_tree = graph_io.TREE_MASK in names  # engines built from a portable graph with token trees
        optional = {graph_io.PAST_LENGTHS, graph_io.TREE_MASK}
        if names - optional != expected:
            raise BundleError(f"engine {role} has I/O {sorted((names - optional) ^ expected)} that "
                              "differ from the graph I/O naming scheme: recompile with --engines trt")

    def _create_contexts(self, trt, phases: list[str]) -> dict[str, Any]:
        n = self.engine.num_optimization_profiles
        if n != len(phases):
            raise BundleError(f"engine has {n} optimization profiles, the manifest lists {phases}; recompile")
        shared = hasattr(trt, "ExecutionContextAllocationStrategy") and hasattr(
            self.engine, "get_device_memory_size_for_profile_v2")
        if shared:
            size = max(int(self.engine.get_device_memory_size_for_profile_v2(i)) for i in range(n))
            self._scratch = self._torch.empty((max(size, 1),), dtype=self._torch.uint8, device=self.device)
        contexts = {}
        for i, phase in enumerate(phases):
            if shared:
                ctx = self.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            else:
                ctx = self.engine.create_execution_context()
            if ctx is None:
                raise BackendError(f"TensorRT create_execution_context returned None for profile {i} ({phase}): "
                                   f"out of GPU memory? {' | '.join(self._log[-3:])}")
            if shared:
                ctx.set_device_memory(self._scratch.data_ptr(), self._scratch.numel())
            check_call(ctx.set_optimization_profile_async(i, self.stream.cuda_stream),
                       "set_optimization_profile_async", f"profile {i} ({phase})")
            contexts[phase] = ctx
        self.stream.synchronize()
        return contexts

    def _set_io(self, ctx, shapes: dict[str, tuple], addresses: dict[str, int], where: str) -> None:
        for name, shape in shapes.items():
            check_call(ctx.set_input_shape(name, shape), "set_input_shape", f"{name} {shape}, {where}")
        for name, ptr in addresses.items():
            check_call(ctx.set_tensor_address(name, ptr), "set_tensor_address", f"{name}, {where}")


class TrtRunner(TrtEngine, Runner):
    name = "trt"
    # TensorRT: the contexts before their engine, the engine before its runtime; then the device buffers
    native = ("contexts", "engine", "_runtime", "_scratch", "stream", "_ids", "_positions", "_logits", "_hidden",
              "_ids_host", "_logits_host", "_hidden_host", "_all_rows", "_chain_mask", "_tree_mask",
              "_tree_positions")

    def __init__(self, manifest, role: str, config: DecoderConfig, capacity: int, device: str = "cuda:0",
                 want_hidden: bool = False) -> None:
        import torch

        _trt, dtype = self._open_engine(manifest, role, config, device, want_hidden)
        with torch.cuda.device(self.device):
            c = config
            # past_lengths of a batched engine: one sequence whose every past row counts (the graph's default)
            self._all_rows = torch.full((1,), graph_io.ALL_ROWS, dtype=torch.int64, device=self.device)
            self.cache = KVCache(c.num_layers, capacity, c.num_kv_heads, c.head_dim,
                                 lambda shape: torch.zeros(shape, dtype=dtype, device=self.device),
                                 element_size=torch.finfo(dtype).bits // 8)
            max_s = max(p[graph_io.INPUT_IDS]["max"][1] for p in self.profiles.values())
            self._ids = torch.zeros((1, max_s), dtype=torch.int64, device=self.device)  # [1, S_max]
            self._positions = torch.arange(capacity, dtype=torch.int64, device=self.device)[None]  # [1, capacity]
            self._logits = torch.empty((1, max_s, c.vocab_size), dtype=torch.float32, device=self.device)
            self._hidden = torch.empty((1, max_s, c.hidden_size), dtype=dtype, device=self.device)
            self._ids_host = torch.empty((max_s,), dtype=torch.int64).pin_memory()  # [S_max]
            self._logits_host = torch.empty((max_s, c.vocab_size), dtype=torch.float32).pin_memory()  # [S_max, V]
            self._hidden_host = torch.empty((max_s, c.hidden_size), dtype=torch.float32)  # [S_max, hidden]
            # token trees (docs/trees.md): [1, 1] true (the chain) for every call but a tree verify, which binds
            # its [S, S] mask and its positions (past + depth)
            self.supports_tree = getattr(self, "has_tree", False)
            self._chain_mask = torch.ones((1, 1), dtype=torch.bool, device=self.device)
            self._tree_mask = torch.zeros((max_s * max_s,), dtype=torch.bool, device=self.device)
            self._tree_positions = torch.zeros((1, max_s), dtype=torch.int64, device=self.device)

    def _bind(self, ctx, phase: str, s: int, p: int, tree: bool = False) -> None:
        c = self.config
        where = f"phase {phase}, S={s}, P={p}"
        shapes = {graph_io.INPUT_IDS: (1, s), graph_io.POSITION_IDS: (1, s)}
        positions = self._tree_positions.data_ptr() if tree else self._positions.data_ptr() + 8 * p
        addresses = {graph_io.INPUT_IDS: self._ids.data_ptr(),
                     graph_io.POSITION_IDS: positions,
                     graph_io.LOGITS: self._logits.data_ptr(), graph_io.HIDDEN_STATES: self._hidden.data_ptr()}
        for i in range(c.num_layers):
            k, v = self.cache.keys[i].data_ptr(), self.cache.values[i].data_ptr()
            shapes[graph_io.past_key(i)] = shapes[graph_io.past_value(i)] = (1, p, c.num_kv_heads, c.head_dim)
            addresses[graph_io.past_key(i)], addresses[graph_io.past_value(i)] = k, v  # rows [0, P)
            addresses[graph_io.new_key(i)] = k + self.cache.row_offset(p)  # rows [P, P + S)
            addresses[graph_io.new_value(i)] = v + self.cache.row_offset(p)
        if self.has_past_lengths:
            shapes[graph_io.PAST_LENGTHS] = (1,)
            addresses[graph_io.PAST_LENGTHS] = self._all_rows.data_ptr()
        if self.supports_tree:
            shapes[graph_io.TREE_MASK] = (s, s) if tree else (1, 1)
            addresses[graph_io.TREE_MASK] = (self._tree_mask if tree else self._chain_mask).data_ptr()
        self._set_io(ctx, shapes, addresses, where)

    def _forward_tree(self, token_ids: np.ndarray, past: int, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        s, torch = token_ids.size, self._torch
        with torch.cuda.device(self.device):
            self._tree_mask[:s * s].copy_(torch.from_numpy(np.ascontiguousarray(mask).reshape(-1)))
            self._tree_positions[0, :s].copy_(torch.from_numpy(positions))
        return self._forward(token_ids, past, tree=True)

    def _forward(self, token_ids: np.ndarray, p: int, tree: bool = False) -> np.ndarray:
        s = token_ids.size
        try:
            phase = phase_in_profiles(self.profiles, s, p)
        except ValueError as exc:
            raise InvalidArgument(f"TensorRT engine: {exc}") from None
        torch = self._torch
        ctx = self.contexts[phase]
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self._ids_host[:s] = torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64))
            self._ids[0, :s].copy_(self._ids_host[:s], non_blocking=True)
            self._bind(ctx, phase, s, p, tree)
            check_call(ctx.execute_async_v3(self.stream.cuda_stream), "execute_async_v3",
                       f"phase {phase}, S={s}, P={p}: {' | '.join(self._log[-3:])}")
            self._logits_host[:s].copy_(self._logits[0, :s], non_blocking=True)  # the one copy to the host
            if self.want_hidden:
                self._hidden_host[:s].copy_(self._hidden[0, :s])
            self.stream.synchronize()
        self.hidden_states = self._hidden_host[:s].numpy() if self.want_hidden else None
        return self._logits_host[:s].numpy()

    def describe(self) -> dict[str, Any]:
        e = self.entry
        return {"backend": self.name, "device": str(self.device), "tensorrt": e.tensorrt_version,
                "gpu": e.gpu_name, "precision": e.precision, "engine": e.path}
