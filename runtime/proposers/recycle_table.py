"""Token Recycling's successor table (arXiv 2408.08696): `succ[token] -> the target's top-k next tokens`.

    table = SuccessorTable(vocab_size)          # int32 [V, K], -1 = nothing known yet
    table.refresh(fed_ids, logits)              # every verify pass: row i's top-K becomes succ[fed_ids[i]]
    table.learn_pairs(prev, nxt)                # a committed pair: nxt moves to the front of succ[prev]
    table.row(token)                            # [K] int32, best first (-1 entries: unknown): a copy
    table.entry(token)                          # (ids, confs) lists: the row and its confidences as one read
    table.reset()                               # back to the seed (the bundle's table) or empty: a cold start

Memory is fixed at V * K * 6 bytes (int32 ids, float16 conf; SmolLM2, V = 49,152, K = 8: 2.25 MiB), whatever the
traffic; a refresh costs O(S * V) (one strided max over each row, like the acceptance rule's argmax: `top_k_sorted`),
nothing proportional to the context. A Generator keeps one table per loaded bundle (`table_for`), so what one request
taught carries over to the next in the process.

`conf` (float16 [V, K]) holds, per successor, the target's probability of it renormalized over its row's top K (a softmax over the
K logits, O(S * K) per refresh): how sure the target was, which ranks alone do not say (a rank-0 successor after
"capital of France is" against one after "I"). `auto` keys its acceptance estimates by it (auto.py). Rows that came
from the seed file or from committed pairs have no logits: NaN there.

The bundle may carry a seed table, `recycle/table.npy` (int32 [V, K]), written at compile time from the
target's own greedy answers to a small prompt set (recycle_seed.py). Like every bundle file it is listed in
the manifest with its sha256; `load_table` checks the hash, then shape, dtype and id range, and raises a
typed error (ChecksumMismatch / BundleError) naming the fix.

Threads: one table serves every request on a bundle, so the batch engine's thread and a one-request call
(`Generator.generate` beside a running `BatchEngine`) may refresh and read it at once. Writes (refresh, learn_pairs,
reset) and `row` / `entry` hold `lock`, so a reader never sees a row's ids from one refresh with its confidences from
another (the lock: ~1 us a read on a busy 2-core machine, ~9 reads per auto step: ~10 us against ~0.4 ms for its
candidates and ~20 ms for a SmolLM2 pass). Readers of single ids (`succ[token, 0]`, recycle.py) need no lock: one
element is read whole under the interpreter's lock.
"""

from __future__ import annotations

import functools
import io
import threading
import weakref

import numpy as np

from specrt.core.errors import BundleError, InvalidArgument

TOP_K = 8  # successors kept per token (the paper's k)
MAX_TOP_K = 64
TABLE_FILE = "recycle/table.npy"  # the bundle's seed table, relative to the bundle root
UNKNOWN = -1


class SuccessorTable:
    def __init__(self, vocab_size: int, top_k: int = TOP_K, seed: np.ndarray | None = None) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
            raise InvalidArgument(f"a successor table needs a vocabulary size >= 1, got {vocab_size!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= MAX_TOP_K:
            raise InvalidArgument(f"successors per token must be an integer in [1, {MAX_TOP_K}], got {top_k!r}")
        if seed is not None:
            check_table(seed, vocab_size, "seed table")
            top_k = seed.shape[1]
        self.vocab_size, self.top_k = int(vocab_size), int(top_k)
        self.seed = seed
        self.succ = np.full((self.vocab_size, self.top_k), UNKNOWN, dtype=np.int32)  # [V, K]
        self.conf = np.full((self.vocab_size, self.top_k), np.nan, dtype=np.float16)  # [V, K], NaN = unknown
        self.lock = threading.Lock()  # one table per bundle, several Generators' threads may refresh it
        self.reset()

    @property
    def nbytes(self) -> int:
        return int(self.succ.nbytes + self.conf.nbytes)

    def reset(self) -> None:
        """Forget everything learned: back to the seed table (or empty)."""
        with self.lock:
            self.conf.fill(np.nan)
            if self.seed is None:
                self.succ.fill(UNKNOWN)
            else:
                self.succ[:] = self.seed

    def row(self, token: int) -> np.ndarray:
        with self.lock:
            return self.succ[token].copy()  # [K] int32, best first

    def entry(self, token: int) -> tuple[list[int], list[float]]:
        """succ[token] and conf[token] as lists, read together (another thread may be refreshing the row)."""
        with self.lock:
            return self.succ[token].tolist(), self.conf[token].tolist()

    def refresh(self, fed_ids: np.ndarray, logits: np.ndarray) -> "RowArgmax | None":
        """fed_ids [S] int64, logits [S, V']: row i's K largest logits (best first) become succ[fed_ids[i]].
        Rows that hold -inf among their top K (a screened LM head: exact only at its candidates) keep the
        old entries past their finite ones; columns past the table's vocabulary are ignored. Where a token is fed
        twice (two tree nodes), its last row wins.

        Returns each row's argmax, exactly `logits.argmax(axis=-1)` (the first maximum; the greedy rule reuses it
        instead of reading the rows again: `row_argmax`), or None where the logits are wider than the table."""
        fed_ids = np.asarray(fed_ids, dtype=np.int64).reshape(-1)
        if logits.ndim != 2 or logits.shape[0] != fed_ids.size:
            raise InvalidArgument(f"refresh needs logits [S, V] with S = {fed_ids.size} rows, got {logits.shape}")
        v, k = min(logits.shape[1], self.vocab_size), self.top_k
        if fed_ids.size == 0 or v <= k:
            return None
        top, vals = top_k_sorted(logits[:, :v], k)  # [S, K] best first
        finite = np.isfinite(vals).all(axis=1)  # [S]
        argmax = row_argmax(logits, top, vals, finite) if v == logits.shape[1] else None
        with np.errstate(invalid="ignore", over="ignore"):
            z = np.exp(vals - vals[:, :1])
            conf = (z / z.sum(axis=1, keepdims=True)).astype(np.float16)  # [S, K] softmax over the top K
        fed = fed_ids.tolist()
        ok = (fed_ids >= 0) & (fed_ids < self.vocab_size) & finite
        with self.lock:
            if ok.all() and len(set(fed)) == len(fed):  # the usual pass: every row written whole, in one store
                self.succ[fed_ids] = top
                self.conf[fed_ids] = conf
                return argmax
            for i, tok in enumerate(fed):  # in order: a token fed twice keeps its last row
                if not 0 <= tok < self.vocab_size:
                    continue
                if finite[i]:
                    self.succ[tok] = top[i]
                    self.conf[tok] = conf[i]
                else:
                    keep = np.isfinite(vals[i])
                    self._front(tok, top[i][keep])
        return argmax

    def learn_pairs(self, prev: np.ndarray, nxt: np.ndarray) -> None:
        """Committed pairs (prev[i] followed by nxt[i]): nxt[i] moves to the front of succ[prev[i]]."""
        with self.lock:
            for a, b in zip(np.asarray(prev).tolist(), np.asarray(nxt).tolist()):
                if 0 <= a < self.vocab_size and 0 <= b < self.vocab_size:
                    self._front(a, np.array([b], dtype=np.int32))

    def _front(self, tok: int, first: np.ndarray) -> None:
        self.conf[tok] = np.nan  # no logits: how sure the target was is not known
        row = self.succ[tok]
        rest = row[~np.isin(row, first)]
        self.succ[tok] = np.concatenate([first, rest])[: self.top_k]

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.save(buf, self.succ, allow_pickle=False)
        return buf.getvalue()


# members per column group in top_k_sorted: fewer members gather fewer scattered candidates but partition more group
# maxima. SmolLM2's rows just written by ONNX Runtime (busy machine), 9 rows: 32 members 511 / 435 us, 128: 630 / 441
# in two runs (1 and 4 rows within a few %)
GROUP = 32


def top_k_sorted(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[S, V] -> (ids [S, k] int32, values [S, k]): each row's k largest values, best first (equal values: the lower
    column first; equal values at the k-th place: any of them).

    Where V is a multiple of GROUP, columns are grouped by their residue mod G = V / GROUP: a row's k largest values
    lie in the k groups of largest maximum (each group holding one of them has a maximum at least that value, and
    at most k - 1 groups hold a larger one), so one strided max over the row (SIMD-friendly; a max over short
    contiguous blocks is not), a partition of G group maxima and one of k * GROUP candidates, read with one flat
    `take`, replace a partition of all V columns (~15 ms for `np.argpartition` on SmolLM2's 9-row verify pass, busy
    2-core machine; the grouped form ~0.5 ms: docs/trees.md, "The refresh's cost")."""
    s, v = rows.shape
    if v % GROUP or v // GROUP < k:
        cols = np.argpartition(rows, v - k, axis=1)[:, v - k:]  # [S, k]
        vals = np.take_along_axis(rows, cols, axis=1)
    else:
        g = v // GROUP
        gmax = rows.reshape(s, GROUP, g).max(axis=1)  # [S, G]
        groups = np.argpartition(gmax, g - k, axis=1)[:, g - k:]  # [S, k]
        members, row_starts = _offsets(s, v)  # [GROUP], [S, 1, 1]
        cols = (groups[:, :, None] + members).reshape(s, -1)  # [S, k * GROUP] column ids
        flat = rows.reshape(-1) if rows.flags.c_contiguous else np.ascontiguousarray(rows).reshape(-1)
        cand = flat.take(cols + row_starts[:, 0])  # [S, k * GROUP]
        pick = np.argpartition(cand, cand.shape[1] - k, axis=1)[:, -k:]  # [S, k]
        cols, vals = np.take_along_axis(cols, pick, axis=1), np.take_along_axis(cand, pick, axis=1)
    order = np.lexsort((cols, -vals), axis=1)  # [S, k]: value descending, then column ascending
    return np.take_along_axis(cols, order, axis=1).astype(np.int32), np.take_along_axis(vals, order, axis=1)


class RowArgmax(list):
    """The rows' argmax as `refresh` found it (exactly NumPy's `argmax`): the type the loop trusts (step.verify_rows),
    so a user's proposer whose `observe_verify` returns some list cannot steer the greedy rule."""


@functools.lru_cache(maxsize=64)
def _offsets(s: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """(each group member's column offset [GROUP], each row's start in the flat [S * V] rows [S, 1, 1]): the
    same few shapes every pass, made once."""
    members, starts = (v // GROUP) * np.arange(GROUP), v * np.arange(s)[:, None, None]
    members.flags.writeable = starts.flags.writeable = False
    return members, starts


def row_argmax(logits: np.ndarray, top: np.ndarray, vals: np.ndarray, finite: np.ndarray) -> RowArgmax:
    """logits [S, V] and their top K (`top_k_sorted`: ids, values best first; `finite` [S]: all K finite) -> each
    row's argmax as NumPy's `argmax` gives it (the first maximum). Where the K values are not all equal, every
    column holding the maximum is among them (a column left out is <= the K-th value < the maximum), so the first
    of the K (equal values: lower id first) is the first maximum; rows whose K are all equal, or hold an inf or a
    NaN (NumPy returns the first NaN), are scanned whole."""
    ids = RowArgmax(top[:, 0].tolist())
    for i in np.flatnonzero(~finite | (vals[:, 0] == vals[:, -1])).tolist():
        ids[i] = int(logits[i].argmax())
    return ids


def check_table(table: np.ndarray, vocab_size: int, what: str) -> None:
    """A table is int32 [V, K] with 1 <= K <= MAX_TOP_K and ids in [-1, V): else BundleError naming `what`."""
    if not isinstance(table, np.ndarray) or table.dtype != np.int32 or table.ndim != 2:
        kind = f"{table.dtype} {table.shape}" if isinstance(table, np.ndarray) else type(table).__name__
        raise BundleError(f"{what} must be an int32 [vocab, k] array, got {kind}; recompile the bundle")
    if table.shape[0] != vocab_size or not 1 <= table.shape[1] <= MAX_TOP_K:
        raise BundleError(f"{what} has shape {table.shape}, expected [{vocab_size}, 1..{MAX_TOP_K}] "
                          "(the target's vocabulary); recompile the bundle")
    if table.size and (int(table.min()) < UNKNOWN or int(table.max()) >= vocab_size):
        raise BundleError(f"{what} holds token ids outside [-1, {vocab_size}): min {int(table.min())}, max "
                          f"{int(table.max())}; recompile the bundle")


def load_table(manifest, vocab_size: int) -> np.ndarray | None:
    """The bundle's seed table, checked (sha256, then shape, dtype, id range), or None when it has none."""
    if TABLE_FILE not in manifest.files:
        return None
    from specrt.bundle.manifest import verify_files

    verify_files(manifest, [TABLE_FILE])  # ChecksumMismatch when the file was modified
    path = manifest.path(TABLE_FILE)
    try:
        table = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise BundleError(f"cannot read {TABLE_FILE}: {exc}; recompile the bundle") from None
    check_table(table, vocab_size, TABLE_FILE)
    return table


_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def table_for(gen) -> SuccessorTable:
    """The successor table shared by every request on `gen` (a loaded bundle; created, and its seed checked, on
    first use; dropped with the Generator)."""
    key = gen
    with _TABLES_LOCK:
        table = _TABLES.get(key)
        if table is None:
            table = SuccessorTable(gen.vocab_size, seed=load_table(gen.manifest, gen.vocab_size))
            _TABLES[key] = table
        return table


def request_table(gen, params) -> SuccessorTable:
    """The table a request drafts from: the shared one (`table_for`), or for seeded sampling a fresh copy of the
    bundle's seed table, so that its trees, hence the random numbers it draws, depend on the request alone (the
    same text in every run and process, whatever earlier requests taught the shared table)."""
    table = table_for(gen)
    if params.seed is None or params.greedy:
        return table
    return SuccessorTable(table.vocab_size, table.top_k, seed=table.seed)
