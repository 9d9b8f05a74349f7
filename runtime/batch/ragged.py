"""`RaggedPass`: one ONNX Runtime pass over several sequences' new tokens with one attention node per layer.

The session runs the ragged graph (runtime/backends/ort/ragged_graph.py) derived from the pool's fused graph;
entry b of its attention batch is region b of the `RegionPool`, whose buffers `[B, Hkv, C, D]` are bound whole
(B: the highest region in the call + 1; bound again only when B changes). `run` takes the calls of
`PackedPass.run` (region, token ids, past length, logit rows wanted, attention rows) and gives each call the
logits of that call alone, bit for bit: the attention of entry b multiplies `query_seqlens[b]` rows, the rows of
the call alone (a call shorter than `attn_rows`, a target that pads its calls alone to two rows, counts zero
rows up to it: a one-row product runs another kernel), and every other op works row by row on the calls' real
rows only. A region in the batch without rows counts 0 rows and keeps its cache.

Against the packed graph (one batch-1 attention node per slot and layer): SmolLM2 int4, 8 one-token decodes,
16.4 ms instead of 18.2 ms, interleaved on 2 cores (the fused one-token batched pass, not exact there: 15.6 ms),
and one session whatever the batch instead of one per slot count. Used when the installed ONNX Runtime reads
`query_seqlens` (`ragged_supported`) unless SPECRT_RAGGED=0; else the packed graph (runtime/batch/packed.py).
"""

from __future__ import annotations

import os

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import LOGIT_POSITIONS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH
from specrt.core.errors import BackendError, InvalidArgument
from specrt.runtime.backends.ort.ragged_graph import (BATCH_SHAPE, FLAT_SHAPE, IN_ROWS, OUT_ROWS, QUERY_SEQLENS,
                                                      ragged_session, ragged_supported)
from specrt.runtime.backends.ort.runner import binding_runner, import_ort, one_line

RAGGED_ENV = "SPECRT_RAGGED"  # "0": the packed graph even where the ragged one is supported


def use_ragged() -> bool:
    return os.environ.get(RAGGED_ENV, "1") != "0" and ragged_supported(import_ort())


class RaggedPass:
    def __init__(self, pool, threads: int | None = None, alternating: bool = False) -> None:
        c = pool.config
        self.pool, self.config = pool, c
        self.n = pool.max_batch
        self.sizes = [pool.max_batch]  # one graph whatever the batch (PackedPasses' attribute)
        ort = import_ort()
        try:
            self.session, width = ragged_session(ort, pool.onnx_path, threads, alternating)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime could not build the ragged graph of {pool.onnx_path}: "
                               f"{one_line(exc)}") from None
        self._binding = self.session.io_binding()
        self._run = binding_runner(self.session, self._binding)
        self._total = np.array(pool.capacity, np.int32)  # an upper bound of every entry's length
        self._flat = np.array([1, -1, width], np.int64)
        self._binding.bind_cpu_input(TOTAL_SEQUENCE_LENGTH, self._total)
        self._binding.bind_cpu_input(FLAT_SHAPE, self._flat)
        self._bound_b = 0
        self._logits = np.empty((0, c.vocab_size), np.float32)
        self._hidden = np.empty((0, c.hidden_size), np.float32)

    @property
    def sessions(self) -> list:
        return [self.session]

    def _bind_regions(self, bsz: int) -> None:
        pool, b = self.pool, self._binding
        for i in range(self.config.num_layers):
            for name_in, name_out, bufs in ((graph_io.past_key(i), graph_io.present_key(i), pool.keys),
                                            (graph_io.past_value(i), graph_io.present_value(i), pool.values)):
                buf = bufs[i]
                shape = [bsz] + list(buf.shape[1:])
                b.bind_input(name_in, "cpu", 0, np.float32, shape, buf.ctypes.data)
                b.bind_output(name_out, "cpu", 0, np.float32, shape, buf.ctypes.data)
        self._bound_b = bsz

    def run(self, calls: list[tuple]) -> list[np.ndarray]:
        """calls: (region, token ids [S], past length, (first, count) logit rows[, attn_rows]) with distinct regions
        -> per call the logits of its rows [first, first + count) ([count, V] views, valid until the next run).
        Writes each call's S key/value rows at [past, past + S) of its region (and, for a call padded to
        attn_rows, zero-row keys after them, where the next call writes, as `PackedPass.run`)."""
        by_region: dict[int, tuple] = {}
        for region, ids, past, want, *pad in calls:
            if not 0 <= region < self.n or region in by_region:
                raise InvalidArgument(f"ragged pass: region {region} is out of range or given twice")
            if past + ids.size > self.pool.capacity:
                raise InvalidArgument(f"ragged pass: {past} + {ids.size} positions exceed the cache capacity "
                                      f"{self.pool.capacity}")
            by_region[region] = (ids, past, want, pad[0] if pad else 1)
        if not by_region:
            return []
        counted = {}  # region -> attention rows counted (real rows, or up to attn_rows with zero rows)
        for r, (ids, past, _, attn_rows) in by_region.items():
            k = ids.size
            counted[r] = attn_rows if k < attn_rows and past + attn_rows <= self.pool.capacity else k
        groups = self._groups(by_region, counted)
        if len(groups) == 1:
            return self._pass(by_region, counted, calls)
        out = {}
        for group in groups:  # each group's outputs copied out before the next pass reuses the buffers
            mine = [c for c in calls if c[0] in group]
            out.update(zip((c[0] for c in mine), [o.copy() for o in self._pass(by_region, counted, mine)]))
        return [out[c[0]] for c in calls]

    def _groups(self, by_region: dict, counted: dict) -> list[set]:
        """The regions of each pass. In one pass every entry has the chunk's S rows (the most any call counts), so a
        call that cannot take them runs in a later pass with a smaller S: a one-row call beside longer ones (the
        kernel's product would have S rows where the call alone has one: another kernel, other bits; a one-row
        target's decode beside verify passes, or a two-row target's call at the last cache position), and a call
        whose past + S would pass the cache capacity (the kernel refuses it). The call counting the most rows in
        what is left always fits its own pass, so this ends."""
        left, groups = set(by_region), []
        while left:
            s = max(counted[r] for r in left)
            group = {r for r in left if (counted[r] > 1 or s == 1) and by_region[r][1] + s <= self.pool.capacity}
            groups.append(group)
            left -= group
        return groups

    def _pass(self, by_region: dict, counted: dict, calls: list[tuple]) -> list[np.ndarray]:
        """One run over `calls` (a subset of by_region's regions)."""
        regions = sorted(c[0] for c in calls)
        mine = set(regions)
        bsz = regions[-1] + 1
        s_max = max(counted[r] for r in regions)
        ids = np.concatenate([by_region[r][0] for r in regions]).astype(np.int64, copy=False)[None, :]
        n_rows = ids.shape[1]
        in_rows = np.full(bsz * s_max, n_rows, np.int64)  # n_rows: the zero row appended after the real ones
        out_rows = np.empty(n_rows, np.int64)
        seqlens = np.zeros(bsz, np.int32)
        query = np.zeros(bsz, np.int32)
        logit_pos, spans = [], {}
        row = 0
        for b in range(bsz):
            if b not in mine:  # in the batch without rows: 0 counted rows, its cache untouched (one cached
                continue  # token as far as the kernel knows: an idle entry's past + S must fit the capacity too)
            ids_b, past, (first, count), _ = by_region[b]
            k = ids_b.size
            in_rows[b * s_max:b * s_max + k] = np.arange(row, row + k)
            out_rows[row:row + k] = np.arange(b * s_max, b * s_max + k)
            query[b], seqlens[b] = counted[b], past + counted[b] - 1
            spans[b] = (len(logit_pos), count)
            logit_pos.extend(range(row + first, row + first + count))
            row += k
        r = len(logit_pos)
        if self._logits.shape[0] < r:
            self._logits = np.empty((r, self.config.vocab_size), np.float32)
        if self._hidden.shape[0] < n_rows:
            self._hidden = np.empty((n_rows, self.config.hidden_size), np.float32)
        if bsz != self._bound_b:
            self._bind_regions(bsz)
        b = self._binding
        self._keep = (ids, in_rows, out_rows, np.array(logit_pos, np.int64), seqlens, query,
                      np.array([bsz, s_max, -1], np.int64))
        for name, arr in zip((graph_io.INPUT_IDS, IN_ROWS, OUT_ROWS, LOGIT_POSITIONS, SEQLENS_K, QUERY_SEQLENS,
                              BATCH_SHAPE), self._keep):
            b.bind_cpu_input(name, arr)
        b.bind_output(graph_io.LOGITS, "cpu", 0, np.float32, [1, r, self.config.vocab_size], self._logits.ctypes.data)
        b.bind_output(graph_io.HIDDEN_STATES, "cpu", 0, np.float32, [1, n_rows, self.config.hidden_size],
                      self._hidden.ctypes.data)
        try:
            self._run()
        except Exception as exc:
            raise BackendError(f"ONNX Runtime ragged pass failed ({len(calls)} sequences, {n_rows} rows): "
                               f"{one_line(exc)}") from None
        return [self._logits[start:start + count] for start, count in (spans[call[0]] for call in calls)]
