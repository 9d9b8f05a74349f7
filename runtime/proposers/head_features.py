"""The target features a draft head has not read yet, bounded (the `head` method, head.py; auto's head source,
head_source.py).

    q = FeatureQueue()
    q.start(target_hidden, n)        # the prefill's last chunk: positions n-1-S .. n-2
    q.add(n, target_hidden)          # a verify pass's committed rows
    feats, first = q.take(runner)    # the runner's cache cut to the committed rows it keeps; then feed feats at `first`

A head's KV cache holds one row per committed position whose target feature it has read; the features of positions
committed since its last call wait here and are fed in its next call. A head that sits out steps (auto stops
drafting a weak head, hybrid's n-gram branch, k = 0) would queue a row per committed token for as long as it sits out
(and then feed them all in one call). The queue keeps the newest `window` rows (WINDOW: the prefill chunk a head
starts from): past that the oldest are dropped and the next call restarts the head's cache at the first row kept, as
`start` does on a prompt longer than a chunk (the head then reads a shorter context; the target verifies every draft,
so output is unchanged). Memory: at most 2 * window rows (a trimmed chunk is a view of its rows while they are at
least half of them, then a copy).
"""

from __future__ import annotations

import numpy as np

WINDOW = 256  # rows: the loop's PREFILL_CHUNK, the most a head reads at `start`


class FeatureQueue:
    def __init__(self, window: int | None = None) -> None:
        self.window = int(WINDOW if window is None else window)
        if self.window < 1:
            raise ValueError(f"a feature window needs at least 1 row, got {self.window}")
        self._chunks: list[np.ndarray] = []  # [rows, F] target features of committed positions not yet fed
        self.first = 0  # position of the first queued feature
        self.rows = 0  # head cache rows holding committed positions (target features)
        self.n = 0  # committed length at the last start / add
        self._restart = True  # the next take empties the head's cache (a start, or rows dropped)

    @property
    def queued(self) -> int:
        """Rows queued (the head's next call feeds them all)."""
        return sum(c.shape[0] for c in self._chunks)

    @property
    def nbytes(self) -> int:
        """Bytes the queue keeps alive (a trimmed chunk keeps its step's whole array)."""
        return sum((c.base if c.base is not None else c).nbytes for c in self._chunks)

    def start(self, target_hidden: np.ndarray, n: int) -> None:
        rows = target_hidden.shape[0]  # the prefill's last chunk: positions n-1-rows .. n-2
        self._chunks = [np.array(target_hidden, dtype=np.float32)]
        self.first, self.rows, self.n, self._restart = n - 1 - rows, 0, n, True
        self._trim()

    def add(self, n: int, target_hidden: np.ndarray | None) -> None:
        """tokens[:n] committed: the verify pass (from position self.n - 1) gave the features of its first n - self.n
        rows. Without features (none handed over) the queue restarts empty at the next committed position."""
        rows = n - self.n
        if rows > 0:
            if target_hidden is None:
                self._chunks, self.first, self._restart = [], n - 1, True
            else:
                self._chunks.append(np.array(target_hidden[:rows], dtype=np.float32))
                self._trim()
        self.n = n

    def take(self, runner) -> tuple[np.ndarray, int] | None:
        """(features [rows, F], position of the first); `runner`'s cache is cut to the committed rows it keeps (none
        after a restart), the last call's draft rows dropped; the queue is then empty. None when nothing is queued
        (the head has no row to draft from)."""
        if not self._chunks:
            return None
        if self._restart:
            self.rows, self._restart = 0, False
        runner.truncate(self.rows)
        feats = self._chunks[0] if len(self._chunks) == 1 else np.concatenate(self._chunks)
        first = self.first
        self._chunks = []
        self.rows += feats.shape[0]
        self.first += feats.shape[0]
        return feats, first

    def _trim(self) -> None:
        extra = self.queued - self.window
        if extra <= 0:
            return
        self._restart = True
        self.first += extra
        while extra > 0:
            c = self._chunks[0]
            if c.shape[0] <= extra:
                self._chunks.pop(0)
                extra -= c.shape[0]
            else:  # a view of the rows kept, copied once it holds under half of its array (a prefill's chunk)
                kept = c[extra:]
                owner = kept.base if kept.base is not None else kept
                self._chunks[0] = kept.copy() if 2 * kept.shape[0] < owner.shape[0] else kept
                extra = 0
