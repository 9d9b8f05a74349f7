"""`BatchRunner`: one compiled model with `max_batch` KV slots, several sequences per pass.

The contract of the batch runners over the batched portable graph (`past_lengths [B]`, compiler/past_lengths.py):
ONNX Runtime on the CPU (ort/batch_runner.py, the reference every test runs) and TensorRT (trt/batch_runner.py,
its engines' profiles with a batch range: `specrt compile --engines trt --max-batch N`).

    runner.forward_batch([ids_0, ..., ids_{B-1}])   # ids_b: [S_b] int64 for slot b, S_b >= 0
        -> [logits_0 [S_0, V], ...]                   # one pass; each slot's rows as if it ran alone
    runner.forward_batch([...], first=f)            # the same over slots [f, f + B) (their blocks are contiguous)
    runner.lengths          # [max_batch] positions cached per slot
    runner.truncate(b, n)   # O(1) rollback of slot b (rejected drafts)
    runner.reset(b)         # slot b empty, for a new request

A pass runs slots [0, B): decodes (S_b = 1), verifies (k + 1) and prompt chunks of different sizes together,
right-padded to S = max S_b (a padded row repeats the slot's last token and is never read back); a slot with
S_b = 0 sits the pass out (one dummy row, nothing committed). The KV cache is static: per layer one buffer
`[max_batch, max_seq_len - 1, Hkv, D]`, slot b's block always bound whole as its past (`past_key.{i}` is
[B, max_seq_len - 1, Hkv, D], contiguous for slots [0, B)) with `past_lengths[b]` = its length masking the rest;
the graph's S new rows per slot come out in a staging buffer and are copied to rows [L_b, L_b + S_b) of the slot
(a copy proportional to S, not to the context; a row at position max_seq_len - 1 is never read again, so it is
not kept). Attention reads each slot's whole block (masked), the price of one shape for every batch.
Inputs are checked in Python (slot count, token range, context) before any native code runs.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.models.config import DecoderConfig


class BatchRunner(abc.ABC):
    name: str = "?"

    def __init__(self, config: DecoderConfig, max_batch: int, max_seq_len: int) -> None:
        if max_batch < 1:
            raise InvalidArgument(f"max_batch must be >= 1, got {max_batch}")
        if max_seq_len < 2:
            raise InvalidArgument(f"max_seq_len must be >= 2, got {max_seq_len}")
        self.config, self.max_batch, self.max_seq_len = config, max_batch, max_seq_len
        self.past_rows = max_seq_len - 1  # P of every pass: each slot's whole block
        self.lengths = np.zeros(max_batch, np.int64)  # [max_batch]
        self.hidden_states: list[np.ndarray] | None = None  # per slot [S_b, hidden] after a pass, when wanted

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def reset(self, slot: int) -> None:
        self._slot(slot)
        self.lengths[slot] = 0

    def truncate(self, slot: int, length: int) -> None:
        self._slot(slot)
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of {self.lengths[slot]} positions to {length}")
        self.lengths[slot] = length

    def _slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_batch:
            raise InvalidArgument(f"slot {slot} is outside 0..{self.max_batch - 1}")

    def check(self, token_ids: Sequence[np.ndarray], first: int = 0) -> tuple[list[int], int]:
        """(new tokens per slot, padded S) of a valid call over slots [first, first + B); InvalidArgument naming
        the slot otherwise."""
        b = len(token_ids)
        if not 0 <= first < self.max_batch or not 1 <= b <= self.max_batch - first:
            raise InvalidArgument(f"forward_batch takes 1..{self.max_batch} slots within 0..{self.max_batch - 1}, "
                                  f"got {b} from slot {first}")
        counts = []
        for slot, ids in enumerate(token_ids, first):
            ids = np.asarray(ids)
            if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
                raise InvalidArgument(f"slot {slot}: token ids must be a 1-D integer array, got shape {ids.shape} "
                                      f"{ids.dtype}")
            outside = ids[(ids < 0) | (ids >= self.vocab_size)] if ids.size else ids
            if outside.size:
                raise InvalidArgument(f"slot {slot}: token id {int(outside[0])} is outside the vocabulary "
                                      f"[0, {self.vocab_size})")
            if self.lengths[slot] + ids.size > self.max_seq_len:
                raise InvalidArgument(f"slot {slot}: {ids.size} new token(s) at position {self.lengths[slot]} exceed "
                                      f"the compiled context of {self.max_seq_len} tokens")
            counts.append(int(ids.size))
        if max(counts) == 0:
            raise InvalidArgument("forward_batch needs at least one slot with new tokens")
        return counts, max(counts)

    def layout(self, token_ids: Sequence[np.ndarray], counts: list[int], s: int, first: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Right-padded (ids [B, S], positions [B, S], past_lengths [B]) of a checked call over slots from `first`."""
        b = len(token_ids)
        ids = np.zeros((b, s), np.int64)
        positions = np.zeros((b, s), np.int64)
        for slot, (row, n) in enumerate(zip(token_ids, counts)):
            length = int(self.lengths[first + slot])
            if n:
                ids[slot, :n] = row
                ids[slot, n:] = row[-1]
            last = min(length + max(n, 1) - 1, self.max_seq_len - 1)
            positions[slot] = np.minimum(np.arange(length, length + s), last)
        return ids, positions, self.lengths[first:first + b].copy()

    def forward_batch(self, token_ids: Sequence[np.ndarray], first: int = 0) -> list[np.ndarray]:
        """One pass over slots [first, first + len(token_ids)); see the module docstring. Returns each slot's
        logits [S_b, V] (views valid until the next call)."""
        counts, s = self.check(token_ids, first)
        ids, positions, lengths = self.layout(token_ids, counts, s, first)
        logits, hidden = self._run(ids, positions, lengths, first)  # [B, S, V], [B, S, hidden] or None
        slots, rows, src = self.commit_index(lengths, counts)
        self._commit(slots + first, rows, slots, src)
        self.lengths[first:first + len(counts)] += counts
        self.hidden_states = None if hidden is None else [hidden[b, :n] for b, n in enumerate(counts)]
        return [logits[b, :n] for b, n in enumerate(counts)]

    def commit_index(self, lengths: np.ndarray, counts: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slot, cache row, staged row) per new row kept: slot b's staged rows [0, n_b) go to its rows
        [L_b, L_b + n_b), except rows at or past `past_rows` (the last position's row: never read again)."""
        kept = [max(0, min(n, self.past_rows - int(length))) for length, n in zip(lengths, counts)]
        slots = np.repeat(np.arange(len(kept)), kept)
        src = np.concatenate([np.arange(k) for k in kept])
        return slots, lengths[slots] + src, src

    @abc.abstractmethod
    def _run(self, ids: np.ndarray, positions: np.ndarray, lengths: np.ndarray, first: int = 0
             ) -> tuple[np.ndarray, Any]:
        """One graph pass over slots [first, first + B) (past = each slot's whole block, `past_lengths` =
        lengths); the S new key/value rows per slot land in the runner's staging buffers (index 0 = slot
        `first`). Returns (logits [B, S, V], hidden states [B, S, hidden] or None when the runner does not want
        them), on the host."""

    @abc.abstractmethod
    def _commit(self, slots: np.ndarray, rows: np.ndarray, staged_slots: np.ndarray, src: np.ndarray) -> None:
        """Per layer, keys and values: cache[slots, rows] = staged[staged_slots, src] (`commit_index`; slots are
        absolute, staged_slots count from the pass's first slot)."""

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "max_batch": self.max_batch, "max_seq_len": self.max_seq_len}
