"""TensorRT runner of the draft head: the engine `engines.draft_head` (compile --engines trt with --draft head:DIR).

The head's contract is the ONNX Runtime runner's (runtime/backends/ort/head_runner.py, `HeadRunner`): features
[S, D] and token ids at positions [position, position + S) in, logits [S, V'] and features [S, D] out, one KV pair
of [1, capacity, Hkv, D] on the device. As in the target's runner (runner.py), `past_key` / `past_value` are bound to
rows [0, P) of that buffer and `new_key` / `new_value` to rows [P, P + S), so TensorRT writes the new rows in
place. Profiles: `specrt.bundle.profiles.head_profiles` (decode: one row; prefill: up to PREFILL_CHUNK_MAX rows;
longer calls run in chunks, `HeadRunner.__call__`). Buffers take the dtype the engine declares for each tensor
(fp32, or fp16 / bf16 in a half-precision engine); features and logits cross to the host as float32.

NOT executed: written against the TensorRT 10 API; no GPU was available where it was written (docs/gpu-tensorrt.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.profiles import head_phase, head_profiles
from specrt.core.errors import BundleError, InvalidArgument
from specrt.runtime.backends.trt.compat import check_call
from specrt.runtime.backends.trt.runner import TrtEngine
from specrt.runtime.backends.ort.head_runner import HeadRunner


def max_rows(profiles: dict[str, Any]) -> int:
    """The most rows one call of the head engine takes (its largest profile's S)."""
    return max(p[graph_io.INPUT_IDS]["max"][1] for p in profiles.values())


class TrtHeadRunner(TrtEngine, HeadRunner):
    name = "trt"

    def __init__(self, manifest, capacity: int, device: str = "cuda:0") -> None:
        self._device_name = device
        HeadRunner.__init__(self, manifest, capacity)

    def _open(self, manifest, capacity: int, threads: int) -> None:
        entry = manifest.draft_head
        self.profiles = head_profiles(entry, manifest.max_seq_len)
        trt = self._load_plan(manifest, graph_io.HEAD_ENGINE_ROLE, self._device_name, self._check_head_io)
        torch = self._torch
        types = {getattr(trt, name): t for name, t in (("float32", torch.float32), ("float16", torch.float16),
                                                      ("bfloat16", torch.bfloat16)) if hasattr(trt, name)}

        def dtype(name: str):
            t = self.engine.get_tensor_dtype(name)
            if t not in types:
                raise BundleError(f"draft head engine: tensor {name} has type {t}, expected fp32 / fp16 / bf16")
            return types[t]

        self.max_rows = m = max_rows(self.profiles)
        d = entry.hidden_size
        with torch.cuda.device(self.device):
            shape = (1, capacity, entry.num_kv_heads, entry.head_dim)
            self.keys = torch.zeros(shape, dtype=dtype("past_key"), device=self.device)
            self.values = torch.zeros(shape, dtype=dtype("past_value"), device=self.device)
            self._row_bytes = entry.num_kv_heads * entry.head_dim * self.keys.element_size()
            self._features = torch.empty((1, m, d), dtype=dtype("features"), device=self.device)
            self._ids = torch.empty((1, m), dtype=torch.int64, device=self.device)
            self._positions = torch.arange(manifest.max_seq_len + m, dtype=torch.int64, device=self.device)[None]
            self._logits = torch.empty((1, m, entry.draft_vocab_size), dtype=dtype(graph_io.LOGITS),
                                       device=self.device)
            self._hidden = torch.empty((1, m, d), dtype=dtype(graph_io.HIDDEN_STATES), device=self.device)

    def _check_head_io(self, trt, role: str) -> None:
        names = {self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)}
        expected = set(graph_io.HEAD_INPUTS) | set(graph_io.HEAD_OUTPUTS)
        if names != expected:
            raise BundleError(f"engine {role} has I/O {sorted(names ^ expected)} that differ from the draft head's "
                              "graph: recompile with --engines trt")

    def _run(self, features: np.ndarray, token_ids: np.ndarray, position: int, p: int
             ) -> tuple[np.ndarray, np.ndarray]:
        s = token_ids.size
        try:
            phase = head_phase(self.profiles, s, p)
        except ValueError as exc:
            raise InvalidArgument(f"TensorRT draft head: {exc}") from None
        torch, ctx = self._torch, self.contexts[phase]
        where = f"draft head, phase {phase}, S={s}, P={p}"
        entry_kv = tuple(self.keys.shape[2:])
        k, v = self.keys.data_ptr(), self.values.data_ptr()
        shapes = {"features": (1, s, self._features.shape[2]), graph_io.INPUT_IDS: (1, s),
                  graph_io.POSITION_IDS: (1, s), "past_key": (1, p, *entry_kv), "past_value": (1, p, *entry_kv)}
        addresses = {"features": self._features.data_ptr(), graph_io.INPUT_IDS: self._ids.data_ptr(),
                     graph_io.POSITION_IDS: self._positions.data_ptr() + 8 * position,
                     "past_key": k, "past_value": v,  # rows [0, P)
                     "new_key": k + self._row_bytes * p, "new_value": v + self._row_bytes * p,  # rows [P, P + S)
                     graph_io.LOGITS: self._logits.data_ptr(), graph_io.HIDDEN_STATES: self._hidden.data_ptr()}
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self._features[0, :s].copy_(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)))
            self._ids[0, :s].copy_(torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64)))
            self._set_io(ctx, shapes, addresses, where)
            check_call(ctx.execute_async_v3(self.stream.cuda_stream), "execute_async_v3",
                       f"{where}: {' | '.join(self._log[-3:])}")
            logits = self._logits[0, :s].float().cpu()
            hidden = self._hidden[0, :s].float().cpu()
            self.stream.synchronize()
        return logits.numpy(), hidden.numpy()
