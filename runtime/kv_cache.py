"""Prefix-bound KV cache: one preallocated buffer per layer, no copy proportional to the context per step.

Layout per layer and for keys and values alike: [1, capacity, kv_heads, head_dim], sequence-major, so
the first `length` rows are one contiguous block. A forward pass binds rows [0, length) as the graph's
`past_*` input and rows [length, length + S) as the place where the graph's `new_*` outputs land.
The two ranges never overlap. Rolling back rejected draft tokens is `truncate(n)`: an integer store.
After a token tree's verify pass, `compact(start, rows)` moves the accepted path's rows to consecutive positions
(O(depth) rows per layer, docs/trees.md).
"""

from __future__ import annotations

from typing import Any, Callable

from specrt.core.errors import InvalidArgument


class KVCache:
    seq_axis = 1  # the position axis of every layer's buffer

    def __init__(self, num_layers: int, capacity: int, kv_heads: int, head_dim: int,
                 zeros: Callable[[tuple[int, ...]], Any], element_size: int = 4) -> None:
        shape = (1, capacity, kv_heads, head_dim)
        self.keys = [zeros(shape) for _ in range(num_layers)]  # L x [1, capacity, Hkv, D]
        self.values = [zeros(shape) for _ in range(num_layers)]  # L x [1, capacity, Hkv, D]
        self.capacity = capacity
        self.row_shape = (kv_heads, head_dim)  # one position of one layer
        self.row_bytes = kv_heads * head_dim * element_size
        self.length = 0  # rows [0, length) hold valid positions

    def row_offset(self, row: int) -> int:
        """Byte offset of position `row` inside any layer's buffer (where new rows are bound)."""
        return row * self.row_bytes

    def reserve(self, new_tokens: int) -> None:
        """Check that S new rows fit; raise before any backend sees the call."""
        if self.length + new_tokens > self.capacity:
            raise InvalidArgument(
                f"{new_tokens} new token(s) at position {self.length} exceed the compiled context of "
                f"{self.capacity} tokens"
            )

    def truncate(self, length: int) -> None:
        """Forget positions >= length (O(1) rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length

    def compact(self, start: int, rows: list[int]) -> None:
        """Move cache rows `rows` (ascending, each >= its destination) to rows start, start + 1, ... in every
        layer's buffer, keys and values: the accepted path of a token tree into consecutive positions. Touches
        len(rows) rows per layer; rows already in place are skipped. The length is left to `truncate`."""
        first = next((i for i, r in enumerate(rows) if r != start + i), None)
        if first is None:
            return
        src, dst = list(rows[first:]), slice(start + first, start + len(rows))
        if any(r < start + first + i for i, r in enumerate(src)):
            raise ValueError(f"compact: rows {rows} cannot move down to {start}..")
        if not hasattr(self.keys[0], "ctypes"):  # torch tensors: index with a tensor on their device
            import torch

            src = torch.tensor(src, device=self.keys[0].device)
        index = (slice(None),) * self.seq_axis
        for buf in (*self.keys, *self.values):
            buf[index + (dst,)] = buf[index + (src,)]  # fancy indexing reads a copy first: overlap is safe
