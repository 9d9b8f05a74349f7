"""The runner contract every backend (PyTorch reference, ONNX Runtime, TensorRT) implements.

A runner is one compiled model plus its KV cache, for batch size 1:

    runner.forward(token_ids)   # token_ids: [S] int64 -> logits [S, V] float32
        appends S positions at the cache's current length and returns the logits of every new position
        (a view valid until the next call). `runner.hidden_states` ([S, hidden]) is the matching final
        hidden state when the runner was created with `want_hidden=True`.
    runner.prefill(token_ids)   # the same in chunks; returns the last position's logits [V]
    runner.truncate(n)          # keep only the first n positions (O(1) rollback of rejected drafts)
    runner.reset()              # empty cache for a new request
    runner.length               # positions currently cached

Inputs are checked in Python (token range, context capacity) before any native code runs.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from ...core.errors import InvalidArgument
from ...models.config import DecoderConfig
from ..kv_cache import KVCache


class Runner(abc.ABC):
    name: str = "?"
    cache: KVCache
    config: DecoderConfig
    hidden_states: np.ndarray | None = None  # [S, hidden] of the last call when want_hidden

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def reset(self) -> None:
        self.cache.truncate(0)

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)

    def check(self, token_ids: np.ndarray) -> None:
        if token_ids.ndim != 1 or token_ids.size == 0:
            raise InvalidArgument(f"forward needs a non-empty 1-D array of token ids, got shape {token_ids.shape}")
        self.cache.reserve(token_ids.size)

    def prefill(self, token_ids: np.ndarray, chunk: int = 256) -> np.ndarray:
        """Feed token_ids in chunks of at most `chunk` (bounded logits memory, within the prefill
        profile); return the last position's logits [V]."""
        logits = None
        for start in range(0, token_ids.size, chunk):
            logits = self.forward(token_ids[start:start + chunk])
        return logits[-1]

    @abc.abstractmethod
    def forward(self, token_ids: np.ndarray) -> np.ndarray:
        """token_ids: [S] int64 -> logits [S, V] float32; appends S positions to the cache."""

    def describe(self) -> dict[str, Any]:
        """Backend facts for stats and `inspect` (provider actually in use, device, dtype)."""
        return {"backend": self.name}
