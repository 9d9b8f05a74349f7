"""`TrtBatchRunner`: several sequences per TensorRT pass (runtime/backends/batch.py), on engines whose optimization
profiles have a batch range (`specrt compile --engines trt --max-batch N`: prefill, decode and verify each take
1..N sequences; bundle/profiles.py).

Written against the TensorRT 10/11 Python API like trt/runner.py, whose engine loading, I/O check and
per-profile execution contexts it shares (`TrtEngine`); NOT executed yet (no GPU here): tests/trt/test_gpu.py
compares it with the ONNX Runtime batch runner on a GPU machine. The contract, the padding, the checks and the
commit rule are the shared `BatchRunner` code that tests/runtime/test_batch_runner.py runs on ONNX Runtime.

Device memory: per layer a KV buffer [max_batch, max_seq_len - 1, Hkv, D] (each slot's block, bound whole as its
past with `past_lengths` masking the rest: attention reads the whole block, the static-cache trade-off) and a
staging buffer for the pass's new rows, copied into place by one indexed copy per layer and tensor (rows
proportional to S, not to the context). Logits [B, S, V] come back to the host in one copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.profiles import phase_in_profiles, profiles_max_batch
from specrt.core.errors import BundleError, InvalidArgument
from specrt.models.config import DecoderConfig
from specrt.runtime.backends.batch import BatchRunner
from specrt.runtime.backends.trt.compat import check_call
from specrt.runtime.backends.trt.runner import TrtEngine


class TrtBatchRunner(TrtEngine, BatchRunner):
    name = "trt"

    def __init__(self, manifest, role: str, config: DecoderConfig, max_batch: int, max_seq_len: int,
                 device: str = "cuda:0", want_hidden: bool = False, engine_from=None) -> None:
        """`engine_from`: a TrtRunner of the same engine whose deserialized engine (its weights on the GPU) this
        runner uses, with execution contexts and a stream of its own (the scheduler's thread and the Generator's
        loop may run at once)."""
        BatchRunner.__init__(self, config, max_batch, max_seq_len)
        profiles = manifest.models[role].profiles or {}
        built = profiles_max_batch(profiles) if profiles else 1
        if max_batch > built:  # before any GPU work
            raise InvalidArgument(f"the {role} engine takes at most {built} sequence(s) per pass (its profiles); "
                                  f"recompile with --engines trt --max-batch {max_batch}")
        _trt, dtype = self._open_engine(manifest, role, config, device, want_hidden, engine_from=engine_from)
        if not self.has_past_lengths:
            raise BundleError(f"the {role} engine has no {graph_io.PAST_LENGTHS} input (built from a portable graph "
                              "before batched passes): recompile with --engines trt --max-batch N")
        torch, c = self._torch, config
        self.dtype = dtype
        with torch.cuda.device(self.device):
            shape = (max_batch, self.past_rows, c.num_kv_heads, c.head_dim)
            self.keys = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(c.num_layers)]
            self.values = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(c.num_layers)]
            self._ids = torch.zeros((0,), dtype=torch.int64, device=self.device)
            self._chain_mask = torch.ones((1, 1), dtype=torch.bool, device=self.device)  # tree_mask: batches are chains
            self._staged = 0  # elements of B * S the buffers below hold
            self._grow(max_batch)

    def _grow(self, rows: int) -> None:
        """Pass buffers for `rows` = B * S token rows (grown on demand: a prefill of 256 tokens x B slots is rare)."""
        torch, c = self._torch, self.config
        if rows <= self._staged:
            return
        row = c.num_kv_heads * c.head_dim
        with torch.cuda.device(self.device):
            self._ids = torch.zeros((rows,), dtype=torch.int64, device=self.device)
            self._positions = torch.zeros((rows,), dtype=torch.int64, device=self.device)
            self._lengths = torch.zeros((self.max_batch,), dtype=torch.int64, device=self.device)
            self._new_k = [torch.empty((rows * row,), dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
            self._new_v = [torch.empty((rows * row,), dtype=self.dtype, device=self.device) for _ in range(c.num_layers)]
            self._logits = torch.empty((rows * c.vocab_size,), dtype=torch.float32, device=self.device)
            self._hidden = torch.empty((rows * c.hidden_size,), dtype=self.dtype, device=self.device)
            self._logits_host = torch.empty((rows * c.vocab_size,), dtype=torch.float32).pin_memory()
        self._staged = rows

    def _run(self, ids: np.ndarray, positions: np.ndarray, lengths: np.ndarray, first: int = 0) -> np.ndarray:
        torch, c = self._torch, self.config
        b, s = ids.shape
        p = self.past_rows
        try:
            phase = phase_in_profiles(self.profiles, s, p, batch=b)
        except ValueError as exc:
            raise InvalidArgument(f"TensorRT engine: {exc}") from None
        self._grow(b * s)
        ctx, where = self.contexts[phase], f"phase {phase}, B={b}, S={s}"
        kv = (c.num_kv_heads, c.head_dim)
        shapes = {graph_io.INPUT_IDS: (b, s), graph_io.POSITION_IDS: (b, s), graph_io.PAST_LENGTHS: (b,)}
        addresses = {graph_io.INPUT_IDS: self._ids.data_ptr(), graph_io.POSITION_IDS: self._positions.data_ptr(),
                     graph_io.PAST_LENGTHS: self._lengths.data_ptr(), graph_io.LOGITS: self._logits.data_ptr(),
                     graph_io.HIDDEN_STATES: self._hidden.data_ptr()}
        if self.has_tree:  # batched passes verify chains (docs/trees.md)
            shapes[graph_io.TREE_MASK], addresses[graph_io.TREE_MASK] = (1, 1), self._chain_mask.data_ptr()
        for i in range(c.num_layers):
            # slots [first, first + B), whole blocks: a contiguous range of each layer's buffer
            shapes[graph_io.past_key(i)] = shapes[graph_io.past_value(i)] = (b, p, *kv)
            addresses[graph_io.past_key(i)], addresses[graph_io.past_value(i)] = (self.keys[i][first].data_ptr(),
                                                                                  self.values[i][first].data_ptr())
            addresses[graph_io.new_key(i)], addresses[graph_io.new_value(i)] = (self._new_k[i].data_ptr(),
                                                                                self._new_v[i].data_ptr())
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self._ids[:b * s].copy_(torch.from_numpy(ids.reshape(-1)))
            self._positions[:b * s].copy_(torch.from_numpy(positions.reshape(-1)))
            self._lengths[:b].copy_(torch.from_numpy(lengths))
            self._set_io(ctx, shapes, addresses, where)
            check_call(ctx.execute_async_v3(self.stream.cuda_stream), "execute_async_v3",
                       f"{where}: {' | '.join(self._log[-3:])}")
            n = b * s * c.vocab_size
            self._logits_host[:n].copy_(self._logits[:n], non_blocking=True)  # the one copy to the host
            hidden = self._hidden[:b * s * c.hidden_size].view(b, s, c.hidden_size).float().cpu() \
                if self.want_hidden else None
            self.stream.synchronize()
        self._pass_shape = (b, s)
        return self._logits_host[:n].numpy().reshape(b, s, c.vocab_size), None if hidden is None else hidden.numpy()

    def _commit(self, slots: np.ndarray, rows: np.ndarray, staged_slots: np.ndarray, src: np.ndarray) -> None:
        torch, c = self._torch, self.config
        b, s = self._pass_shape
        if not slots.size:
            return
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            slots, rows, staged_slots, src = (torch.from_numpy(a).to(self.device, non_blocking=True)
                                              for a in (slots, rows, staged_slots, src))
            for i in range(c.num_layers):
                for cache, staged in ((self.keys[i], self._new_k[i]), (self.values[i], self._new_v[i])):
                    new = staged[:b * s * c.num_kv_heads * c.head_dim].view(b, s, c.num_kv_heads, c.head_dim)
                    cache[slots, rows] = new[staged_slots, src]
            self.stream.synchronize()

    def describe(self) -> dict[str, Any]:
        e = self.entry
        return BatchRunner.describe(self) | {"device": str(self.device), "tensorrt": e.tensorrt_version,
                                             "precision": e.precision, "engine": e.path}
