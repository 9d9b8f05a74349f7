"""One prefill for sequences with the same prompt (the server's n > 1, a batch of identical prompts).

A sequence admitted while another sequence of the batch (its donor) has the same prompt does not prefill it: the
donor's KV rows [0, P) are copied into its region (a copy, as when regions move down: `RegionPool._move`) and its first
token is picked from the donor's last prompt row's logits, with its own sampling state. If the donor is still
prefilling, the sequence waits for it; a donor that leaves before its prefill is done leaves its waiting sequences to
prefill themselves. The rows are the donor's exactly, so the output is the sequence's own (greedy and seeded: tested
against each sequence alone).

Order: a waiting or copied sequence completes its prefill only as the oldest in prefill (`Scheduler._complete_shared`),
and no younger sequence prefills past it (`blocked`), so regions keep the pool's order (running, then prefilling).
Fused CPU pools (`RegionPool`) only: batch runners (`BatchRunnerPool`) have no row copy between slots.
SPECRT_SHARED_PREFILL=0 turns it off.
"""

from __future__ import annotations

import os

import numpy as np

from specrt.runtime.batch.pool import RegionPool
from specrt.runtime.batch.sequence import BatchSequence


class PromptSharing:
    def __init__(self, pool) -> None:
        self.pool = pool
        self.enabled = isinstance(pool, RegionPool) and os.environ.get("SPECRT_SHARED_PREFILL", "1") != "0"
        self.tokens = 0  # prompt tokens copied instead of prefilled, since start

    def on_admit(self, seq: BatchSequence, active: list[BatchSequence]) -> None:
        """`seq` has its (empty) region: take a donor's prompt rows now, or wait for the donor's prefill."""
        if not self.enabled:
            return
        for d in active:
            if d is seq or d.target is None or d.prompt_ids.size != seq.prompt_ids.size \
                    or not np.array_equal(d.prompt_ids, seq.prompt_ids):
                continue
            last = d.prompt_last if d.prompt_last is not None else d.shared_last
            if last is not None:
                self._take(seq, d, last)
            else:  # d prefills (or waits for its own donor): wait for the one that prefills
                root = d.donor or d
                seq.donor = root
                root.followers.append(seq)
            return

    def on_prefilled(self, seq: BatchSequence, last: np.ndarray) -> None:
        """`seq`'s prompt is in its region (`last` [V]: its last row's logits): hand the rows to its waiting ones
        before anything may free its region."""
        if not self.enabled:
            return
        seq.prompt_last = np.array(last, copy=True)
        for f in seq.followers:
            if f.donor is seq and f.target is not None and not f.cancel.is_set():
                self._take(f, seq, seq.prompt_last)
        seq.followers = []

    def on_finish(self, seq: BatchSequence) -> None:
        for f in seq.followers:  # left before its prefill was done: they prefill themselves
            f.donor = None
        seq.followers, seq.prompt_last, seq.shared_last, seq.donor = [], None, None, None

    @staticmethod
    def blocked(seq: BatchSequence) -> bool:
        """Whether `seq` takes no prompt chunk (it waits for a donor, or has its rows): nothing after it may either."""
        return seq.donor is not None or seq.shared_last is not None

    def _take(self, f: BatchSequence, d: BatchSequence, last: np.ndarray) -> None:
        n = d.prompt_ids.size
        src, dst = self.pool.region_of(d.target), self.pool.region_of(f.target)
        for bufs in (self.pool.keys, self.pool.values):
            for buf in bufs:
                buf[dst, :, :n] = buf[src, :, :n]
        f.target.cache.length = n
        f.prefilled = n
        f.shared_last, f.donor = last, None
        self.tokens += n
