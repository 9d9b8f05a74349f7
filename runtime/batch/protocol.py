"""The scheduler's contract with a KV pool: what `RegionPool` (pool.py, the fused CPU graph's regions) and
`BatchRunnerPool` (slots.py, a batch runner's slots) both offer, and the call a multi-sequence pass takes.

Regions in use are the prefix [0, used) in the scheduler's order (decoding requests first, then those in prefill);
`release` moves the regions above the freed one down by one (a RegionPool copies their rows, a BatchRunnerPool
renumbers them).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np


class PassCall(NamedTuple):
    """One sequence's part of a multi-sequence pass (`MultiPass.run`): its S token ids at `past` in its region, the
    logit rows returned [first, first + count), and `attn_rows`: a call of fewer rows runs its attention over that
    many (a target whose calls alone are padded to min_rows; packed.py). A tuple, so passes may unpack it."""

    region: int
    ids: np.ndarray  # [S] int64
    past: int
    logits: tuple[int, int]  # (first, count)
    attn_rows: int = 1


class MultiPass(Protocol):
    """Several sequences' calls in one pass, each call's rows exactly (fused: bit for bit) its call alone."""

    def run(self, calls: list[PassCall]) -> list[np.ndarray]:
        """-> per call its logit rows [count, V] (views valid until the next run); writes each call's key/value rows
        at [past, past + S) of its region."""


class RegionRunner(Protocol):
    """A region's single-sequence runner: the calls the scheduler and the step (runtime/step.py) make of it."""

    min_rows: int
    cache: Any  # `length` (settable), `reserve(n)`

    @property
    def length(self) -> int: ...

    def forward(self, token_ids: np.ndarray) -> np.ndarray: ...  # [S] -> logits [S, V]

    def forward_last(self, token_ids: np.ndarray) -> np.ndarray: ...  # [S] -> logits [V] of the last row

    def truncate(self, n: int) -> None: ...

    def reset(self) -> None: ...


class KVPool(Protocol):
    """A pool of `max_batch` KV regions over one model's weights."""

    max_batch: int
    used: int  # regions [0, used) hold sequences
    batched: bool  # decode_batch is one pass
    runners: list  # runners[i] drives region i (RegionRunner)

    def acquire(self) -> RegionRunner:
        """The runner of region `used` (empty); raises InvalidArgument when every region is in use."""

    def release(self, runner: RegionRunner) -> None:
        """Free the runner's region; the regions above it move down one."""

    def release_all(self) -> None:
        """Free every region at once (after a failed step: the requests were ended)."""

    def region_of(self, runner: RegionRunner) -> int: ...

    def decode_batch(self, ids: np.ndarray) -> np.ndarray:
        """ids [B]: one token for each of regions [0, B) at its own length -> logits [B, V] (a view valid until the
        next call)."""

    def packed(self) -> MultiPass:
        """The multi-sequence pass over this pool's regions."""

    def kv_bytes_per_slot(self) -> int: ...
