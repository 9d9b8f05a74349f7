"""`RegionPool`: one model's KV slot pool for batched decoding, on ONE ONNX Runtime session (one weights copy); the
scheduler's pool contract (`KVPool`, protocol.py), as `BatchRunnerPool` (slots.py) over a batch runner.

Per layer one preallocated buffer for keys and one for values, `[max_batch, Hkv, capacity, D]` (the fused
graph's head-major layout with a batch dimension): region b is `buf[b:b+1]`, one contiguous block per sequence.
Each region is driven by an `OrtFusedRunner` that shares the pool's session and binds its region's views, so
a single sequence's prefill / verify pass is the ordinary runner call (rollback stays `truncate(n)`, a
length per sequence) and every proposer that takes a `Runner` (the draft model) works on a region unchanged.

Regions in use are always the prefix [0, n): `release` shifts the regions above the freed one down by one
(a copy of their valid rows, once per finished request), and runners move with their sequence. So the first
d regions can run as one batch: `decode_batch(d, ids [d])` is one pass of d one-token decodes, each at its own
past length (`seqlens_k [d]`), when the graph has a batch dimension (`batched`); a bundle written before batch
graphs runs the same call as d one-sequence passes.
"""

from __future__ import annotations

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import LOGIT_POSITIONS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH, present_key, present_value
from specrt.core.errors import BackendError, InvalidArgument
from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
from specrt.runtime.backends.ort.runner import binding_runner, one_line
from specrt.runtime.kv_cache import KVCache


def kv_bytes(config, capacity: int) -> int:
    """Bytes of one sequence's fp32 KV cache (keys and values, every layer) of `capacity` positions."""
    return 2 * config.num_layers * config.num_kv_heads * capacity * config.head_dim * 4


def graph_has_batch_dim(session) -> bool:
    """True when the graph's input_ids batch dimension is symbolic (a batch-capable fused graph)."""
    shape = next(i.shape for i in session.get_inputs() if i.name == graph_io.INPUT_IDS)
    return not isinstance(shape[0], int)


class _RegionCache(KVCache):
    """A KVCache over views of the pool's buffers (no allocation of its own)."""

    seq_axis = 2  # [1, Hkv, capacity, D] like HeadMajorKVCache (KVCache.compact)

    def __init__(self, keys: list[np.ndarray], values: list[np.ndarray], capacity: int, row_shape) -> None:
        self.keys, self.values = keys, values  # L x [1, Hkv, capacity, D] views
        self.capacity = capacity
        self.row_shape = row_shape
        self.row_bytes = int(np.prod(row_shape)) * 4
        self.length = 0


class RegionPool:
    def __init__(self, base: OrtFusedRunner, max_batch: int) -> None:
        """`base`: the loaded runner whose session (and settings) the regions share; its own cache is left alone."""
        if max_batch < 1:
            raise InvalidArgument(f"max_batch must be >= 1, got {max_batch}")
        c = base.config
        self.config, self.session, self.max_batch = c, base.session, max_batch
        self.capacity, self.onnx_path, self.threads = base.capacity, base.onnx_path, base.threads
        self.alternating = getattr(base, "alternating", False)
        self._packed = None
        shape = (max_batch, c.num_kv_heads, self.capacity, c.head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(c.num_layers)]  # L x [Bmax, Hkv, C, D]
        self.values = [np.zeros(shape, np.float32) for _ in range(c.num_layers)]
        self.batched = graph_has_batch_dim(self.session)
        self.runners = [OrtFusedRunner(base.onnx_path, c, self.capacity, base.max_short, threads=base.threads,
                                       want_hidden=base.want_hidden, min_rows=base.min_rows, session=self.session,
                                       cache=self._region_cache(b)) for b in range(max_batch)]
        self.used = 0  # regions [0, used) hold sequences; runners[b] drives region b
        v = c.vocab_size
        self._ids = np.zeros((max_batch, 1), np.int64)  # [B, 1]
        self._seqlens = np.zeros(max_batch, np.int32)  # [B]
        self._total = np.zeros((), np.int32)
        self._logits = np.empty((max_batch, 1, v), np.float32)  # [B, 1, V]
        self._hidden = np.empty((max_batch, 1, c.hidden_size), np.float32)
        self._row0 = np.zeros(1, np.int64)
        self._binding = self.session.io_binding() if self.batched else None
        self._bound_b = 0
        self._run = binding_runner(self.session, self._binding) if self.batched else None

    def _region_cache(self, b: int) -> _RegionCache:
        c = self.config
        return _RegionCache([k[b:b + 1] for k in self.keys], [v[b:b + 1] for v in self.values], self.capacity,
                            (c.num_kv_heads, c.head_dim))

    def packed(self):
        """The multi-sequence passes over this pool's regions, built on first use. Both kinds give every call the
        rows of the call alone. A target whose calls alone have two rows or more (`min_rows`, int4 level 4) gets
        the ragged graph (one attention node per layer, runtime/batch/ragged.py) where ONNX Runtime supports it;
        otherwise the packed passes (`PackedPasses`, runtime/batch/packed.py: graphs of `packed_sizes(max_batch)`
        slots), since a one-token call beside longer ones needs a ragged pass of its own (a one-row product)."""
        if self._packed is None:
            from specrt.runtime.batch.ragged import RaggedPass, use_ragged

            if self.runners[0].min_rows > 1 and use_ragged():
                self._packed = RaggedPass(self, self.threads, self.alternating)
            else:
                from specrt.runtime.batch.packed import PackedPasses, packed_sizes

                self._packed = PackedPasses(self, packed_sizes(self.max_batch), self.threads, self.alternating)
        return self._packed

    def kv_bytes_per_slot(self) -> int:
        return kv_bytes(self.config, self.capacity)

    # ------------------------------------------------------------------------------------- slots
    def acquire(self) -> OrtFusedRunner:
        """The runner of the next free region (empty cache). Raises when the pool is full."""
        if self.used >= self.max_batch:
            raise InvalidArgument(f"all {self.max_batch} slots are in use")
        runner = self.runners[self.used]
        runner.reset()
        self.used += 1
        return runner

    def release_all(self) -> None:
        """Free every region (their requests were ended): the next `acquire` resets the runner it hands out."""
        self.used = 0

    def region_of(self, runner: OrtFusedRunner) -> int:
        return self.runners.index(runner, 0, self.used)

    def release(self, runner: OrtFusedRunner) -> None:
        """Free `runner`'s region; the regions above it move down one (rows copied, runners rebound)."""
        b = self.runners.index(runner, 0, self.used)
        for src in range(b + 1, self.used):
            self._move(src, src - 1)
        self.used -= 1
        self.runners[self.used] = runner
        self._rebind(runner, self.used)
        runner.reset()

    def _move(self, src: int, dst: int) -> None:
        mover = self.runners[src]
        n = mover.length + mover.min_rows  # padded rows past the committed length are rewritten by the next call
        n = min(n, self.capacity)
        for bufs in (self.keys, self.values):
            for buf in bufs:
                buf[dst, :, :n] = buf[src, :, :n]
        self.runners[dst] = mover
        self._rebind(mover, dst)

    def _rebind(self, runner: OrtFusedRunner, b: int) -> None:
        length = runner.cache.length
        runner.cache = self._region_cache(b)
        runner.cache.length = length
        runner._bind_cache()

    # ------------------------------------------------------------------------------------ decode
    def decode_batch(self, ids: np.ndarray) -> np.ndarray:
        """ids [B] int64: one new token for each of regions [0, B) at its own length -> logits [B, V] (a view
        valid until the next call). Lengths advance by one. One pass when `batched` and B > 1."""
        bsz = ids.size
        if not 0 < bsz <= self.used:
            raise InvalidArgument(f"decode_batch of {bsz} sequences with {self.used} regions in use")
        if not self.batched or bsz == 1:  # one pass per sequence (bundles without a batch dim; B=1 keeps min_rows)
            out = self._logits[:bsz, 0]
            for b in range(bsz):
                out[b] = self.runners[b].forward(ids[b:b + 1])[-1]
            return out
        for b in range(bsz):
            self.runners[b].cache.reserve(1)
            self._seqlens[b] = self.runners[b].length  # past + 1 - 1
        self._ids[:bsz, 0] = ids
        self._total[()] = int(self._seqlens[:bsz].max()) + 1
        if bsz != self._bound_b:
            self._bind(bsz)
        try:
            self._run()
        except Exception as exc:
            raise BackendError(f"ONNX Runtime batched decode failed (B={bsz}): {one_line(exc)}") from None
        for b in range(bsz):
            self.runners[b].cache.length += 1
        return self._logits[:bsz, 0]

    def _bind(self, bsz: int) -> None:
        c, bnd = self.config, self._binding
        for i in range(c.num_layers):
            for name_in, name_out, buf in ((graph_io.past_key(i), present_key(i), self.keys[i]),
                                           (graph_io.past_value(i), present_value(i), self.values[i])):
                shape = [bsz] + list(buf.shape[1:])
                bnd.bind_input(name_in, "cpu", 0, np.float32, shape, buf.ctypes.data)
                bnd.bind_output(name_out, "cpu", 0, np.float32, shape, buf.ctypes.data)
        bnd.bind_cpu_input(graph_io.INPUT_IDS, self._ids[:bsz])
        bnd.bind_cpu_input(SEQLENS_K, self._seqlens[:bsz])
        bnd.bind_cpu_input(TOTAL_SEQUENCE_LENGTH, self._total)
        bnd.bind_cpu_input(LOGIT_POSITIONS, self._row0)
        bnd.bind_output(graph_io.LOGITS, "cpu", 0, np.float32, [bsz, 1, c.vocab_size], self._logits.ctypes.data)
        bnd.bind_output(graph_io.HIDDEN_STATES, "cpu", 0, np.float32, [bsz, 1, c.hidden_size], self._hidden.ctypes.data)
        self._bound_b = bsz
