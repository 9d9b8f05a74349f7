"""`PackedPass`: one ONNX Runtime pass over several sequences' new tokens, each in its own KV region.

The session runs the packed graph (runtime/backends/ort/packed_graph.py) derived from the pool's fused graph: slot s
of the graph is region s of the `RegionPool`, so a call is a list of (region, token ids, logit rows wanted) and each
region's rows are exactly the call the sequence would make alone (a prefill chunk, a verify pass over its drafts,
a one-token decode; `min_rows` padding in attention only, see `run`). The caller keeps the cache lengths (reserve before, commit after), as
`Runner.forward` does.

A slot without rows in a call runs its attention node on a zero row against a scratch buffer (its region is never
touched). The slot bindings change only when the set of regions in the calls changes; the per-call inputs are
written into bound or freshly bound small arrays.

Those idle slots are not free: each runs one attention node per layer (SmolLM2, 2 regions in use: a pass on the
8-slot graph 7.7 ms int4 / 16.4 ms fp32, on a 2-slot graph 6.1 / 14.7 ms). So a pool keeps packed graphs of
several slot counts (`PackedPasses`, `packed_sizes`: max_batch halved down to 2) and a call runs on the smallest
one that covers its regions; regions in use are a prefix [0, used), so that is the smallest covering `used`.
"""

from __future__ import annotations

import os

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import LOGIT_POSITIONS
from specrt.core.errors import BackendError, InvalidArgument
from specrt.runtime.backends.ort.packed_graph import (IN_ROWS, OUT_ROWS, SLOT_SEQLENS, SLOT_TAKE, SLOT_TOTAL,
                                                      packed_session, slot_name)
from specrt.runtime.backends.ort.runner import binding_runner, import_ort, one_line


PACKED_SIZES_ENV = "SPECRT_PACKED_SIZES"  # e.g. "8" (one graph: less memory) or "2,4,8"


def packed_sizes(max_batch: int) -> list[int]:
    """Slot counts of the packed graphs a pool of `max_batch` regions keeps, ascending: max_batch halved while >= 2
    (8 -> [2, 4, 8]), or SPECRT_PACKED_SIZES (comma-separated counts; max_batch is always added). Each graph is
    one more ONNX Runtime session over the same weights file (measured on SmolLM2, the 4- and 2-slot graphs
    beside the 8-slot one: ~+120 MiB resident int4, ~+210 MiB fp32)."""
    from specrt.core.errors import InvalidArgument

    text = os.environ.get(PACKED_SIZES_ENV, "").strip()
    if text:
        try:
            sizes = {int(x) for x in text.split(",") if x.strip()}
        except ValueError:
            raise InvalidArgument(f"{PACKED_SIZES_ENV} must be comma-separated slot counts, got {text!r}") from None
        if any(n < 1 for n in sizes):
            raise InvalidArgument(f"{PACKED_SIZES_ENV} slot counts must be >= 1, got {text!r}")
        return sorted({n for n in sizes if n < max_batch} | {max_batch})
    sizes, n = [], max_batch
    while n >= 2 or not sizes:
        sizes.append(n)
        n //= 2
    return sorted(sizes)


class PackedPasses:
    """The packed graphs of several slot counts over one pool (`packed_sizes`); `run` takes the smallest graph that
    covers the calls' regions. Every graph binds slot s to the pool's region s, so the choice changes nothing but
    the idle slots' cost (each graph gives a call the rows of the call alone)."""

    def __init__(self, pool, sizes: list[int], threads: int | None = None, alternating: bool = False) -> None:
        self.sizes = sizes
        self.passes = [PackedPass(pool, threads, alternating, slots=n) for n in sizes]

    @property
    def session(self):
        """The largest graph's session."""
        return self.passes[-1].session

    @property
    def sessions(self) -> list:
        return [p.session for p in self.passes]

    def run(self, calls: list[tuple]) -> list[np.ndarray]:
        """`PackedPass.run` on the smallest graph covering the highest region of `calls`."""
        top = max((call[0] for call in calls), default=0)
        return next((p for p in self.passes if top < p.n), self.passes[-1]).run(calls)


class PackedPass:
    def __init__(self, pool, threads: int | None = None, alternating: bool = False, slots: int | None = None) -> None:
        """`alternating`: a draft model's session runs between this one's passes (as for the target's own session:
        the pool threads stop spinning at the end of a run, `cpu_session`). `slots`: the graph's slot count
        (default the pool's max_batch); slot s is region s."""
        c = pool.config
        self.pool, self.config, self.n = pool, c, slots or pool.max_batch
        ort = import_ort()
        try:
            self.session = packed_session(ort, pool.onnx_path, self.n, threads, alternating)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime could not build the packed graph of {pool.onnx_path}: "
                               f"{one_line(exc)}") from None
        self.scratch = np.zeros((1, c.num_kv_heads, 1, c.head_dim), np.float32)
        self._seqlens = np.zeros(self.n, np.int32)
        self._total = np.ones(self.n, np.int32)
        self._take = np.ones(self.n, np.int64)
        self._binding = self.session.io_binding()
        b = self._binding
        for s in range(self.n):
            b.bind_cpu_input(slot_name(SLOT_SEQLENS, s), self._seqlens[s:s + 1])
            b.bind_cpu_input(slot_name(SLOT_TOTAL, s), self._total[s:s + 1])
            self._bind_slot(s, False)
        b.bind_cpu_input(SLOT_TAKE, self._take)
        self._live = [False] * self.n  # slot s bound to region s (else to the scratch buffer)
        self._run = binding_runner(self.session, self._binding)
        self._logits = np.empty((0, c.vocab_size), np.float32)
        self._hidden = np.empty((0, c.hidden_size), np.float32)

    def _bind_slot(self, s: int, live: bool) -> None:
        pool, b = self.pool, self._binding
        for i in range(self.config.num_layers):
            for name_in, name_out, bufs in ((graph_io.past_key(i), graph_io.present_key(i), pool.keys),
                                            (graph_io.past_value(i), graph_io.present_value(i), pool.values)):
                buf = bufs[i][s:s + 1] if live else self.scratch
                b.bind_input(slot_name(name_in, s), "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
                b.bind_output(slot_name(name_out, s), "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)

    def run(self, calls: list[tuple]) -> list[np.ndarray]:
        """calls: (region, token ids [S], past length, (first, count) logit rows[, attn_rows]) with distinct regions
        -> per call the logits of its rows [first, first + count) ([count, V] views, valid until the next run).
        Writes each call's S key/value rows at [past, past + S) of its region.

        `attn_rows` (default 1): a call of fewer rows runs its attention over that many rows, the extra ones zero rows that
        skip every other op (a target whose calls alone are padded to `min_rows` rows, the last token repeated:
        a row's attention output does not depend on the rows after it, so the real rows equal those of the padded
        call alone, and only the real rows pay for the MatMuls). The extra key/value rows land past the call's
        rows, where the next call writes; no padding where it would pass the cache capacity (as alone)."""
        by_slot: dict[int, tuple] = {}
        for region, ids, past, want, *pad in calls:
            if not 0 <= region < self.n or region in by_slot:
                raise InvalidArgument(f"packed pass: region {region} is out of range or given twice")
            if past + ids.size > self.pool.capacity:
                raise InvalidArgument(f"packed pass: {past} + {ids.size} positions exceed the cache capacity "
                                      f"{self.pool.capacity}")
            by_slot[region] = (ids, past, want, pad[0] if pad else 1)
        for s in range(self.n):
            live = s in by_slot
            if live != self._live[s]:
                self._bind_slot(s, live)
                self._live[s] = live
        order = sorted(by_slot)
        ids = np.concatenate([by_slot[s][0] for s in order]).astype(np.int64, copy=False)[None, :]
        n_rows = ids.shape[1]
        in_rows, out_rows, logit_pos, spans = [], [], [], {}  # spans: region -> (first logits row, rows)
        row = pos = 0  # row: packed input row; pos: row in the slot-ordered attention output
        for s in range(self.n):
            if s in by_slot:
                ids_s, past, (first, count), attn_rows = by_slot[s]
                k = ids_s.size
                m = attn_rows if k < attn_rows and past + attn_rows <= self.pool.capacity else k
                in_rows.append(np.arange(row, row + k))
                if m > k:
                    in_rows.append(np.full(m - k, n_rows))  # zero rows (appended after the real ones)
                out_rows.append(np.arange(pos, pos + k))
                spans[s] = (len(logit_pos), count)
                logit_pos.extend(range(row + first, row + first + count))
                self._take[s], self._seqlens[s], self._total[s] = m, past + m - 1, past + m
                row, pos = row + k, pos + m
            else:
                in_rows.append(np.array([n_rows]))  # the zero row appended after the real ones
                self._take[s], self._seqlens[s], self._total[s] = 1, 0, 1
                pos += 1
        r = len(logit_pos)
        if self._logits.shape[0] < r:
            self._logits = np.empty((r, self.config.vocab_size), np.float32)
        if self._hidden.shape[0] < n_rows:
            self._hidden = np.empty((n_rows, self.config.hidden_size), np.float32)
        b = self._binding
        self._keep = (ids, np.concatenate(in_rows), np.concatenate(out_rows), np.array(logit_pos, np.int64))
        b.bind_cpu_input(graph_io.INPUT_IDS, self._keep[0])
        b.bind_cpu_input(IN_ROWS, self._keep[1])
        b.bind_cpu_input(OUT_ROWS, self._keep[2])
        b.bind_cpu_input(LOGIT_POSITIONS, self._keep[3])
        b.bind_output(graph_io.LOGITS, "cpu", 0, np.float32, [1, r, self.config.vocab_size], self._logits.ctypes.data)
        b.bind_output(graph_io.HIDDEN_STATES, "cpu", 0, np.float32, [1, n_rows, self.config.hidden_size],
                      self._hidden.ctypes.data)
        try:
            self._run()
        except Exception as exc:
            raise BackendError(f"ONNX Runtime packed pass failed ({len(calls)} sequences, {n_rows} rows): "
                               f"{one_line(exc)}") from None
        return [self._logits[start:start + count] for start, count in (spans[call[0]] for call in calls)]
