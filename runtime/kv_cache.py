"""Prefix-bound KV cache: one preallocated buffer per layer, no copy proportional to the context per step.

Layout per layer and for keys and values alike: [1, capacity, kv_heads, head_dim], sequence-major, so
the first `length` rows are one contiguous block. A forward pass binds rows [0, length) as the graph's
`past_*` input and rows [length, length + S) as the place where the graph's `new_*` outputs land.
The two ranges never overlap. Rolling back rejected draft tokens is `truncate(n)`: an integer store.
"""

from __future__ import annotations

from typing import Any, Callable

from specrt.core.errors import InvalidArgument


class KVCache:
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
