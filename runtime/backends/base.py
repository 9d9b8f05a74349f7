"""The runner contract every backend (PyTorch reference, ONNX Runtime, TensorRT) implements.

A runner is one compiled model plus its KV cache, for batch size 1:

    runner.forward(token_ids)   # token_ids: [S] int64 -> logits [S, V] float32
        appends S positions at the cache's current length and returns the logits of every new position
        (a view valid until the next call). `runner.hidden_states` ([S, hidden]) is the matching final
        hidden state when the runner was created with `want_hidden=True`.
    runner.forward(token_ids, parents)  # a token tree (runtime/tree.py): parents [S-1] of rows 1.., row 0 the
        root; row i attends to the past plus its ancestors and itself, at position past + depth. Only where
        `runner.supports_tree` (a graph with the tree input, docs/trees.md); else InvalidArgument.
    runner.keep_path(past, rows)  # after a tree pass: cache rows past + r for r in rows move to past + 1, ...
        (O(len(rows)) rows per layer); the caller truncates after
    runner.prefill(token_ids)   # the same in chunks; returns the last position's logits [V]
    runner.forward_last(token_ids)  # forward, returning only the last position's logits [V]
    runner.truncate(n)          # keep only the first n positions (O(1) rollback of rejected drafts)
    runner.reset()              # empty cache for a new request
    runner.length               # positions currently cached
    runner.set_argmax_only(on)  # the caller reads only each logits row's argmax (greedy, unconstrained): a runner
                                # may then return rows that are exact at the argmax candidates and -inf elsewhere
                                # (the screened LM head, compiler/lm_head_screen.py); others ignore it
    runner.close()              # release the session, bindings and buffers (idempotent; `with runner:` too);
                                # a later call raises GeneratorClosed

Inputs are checked in Python (token range, context capacity) before any native code runs.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from specrt.bundle.graph_io import pad_rows
from specrt.core.errors import GeneratorClosed, InvalidArgument
from specrt.models.config import DecoderConfig
from specrt.runtime.kv_cache import KVCache
from specrt.runtime.tree import ancestor_mask, check_parents, depths, is_chain


class Runner(abc.ABC):
    name: str = "?"
    cache: KVCache
    config: DecoderConfig
    hidden_states: np.ndarray | None = None  # [S, hidden] of the last call when want_hidden
    # a fused draft head's target layers joined to hidden_states ([S, (1 + n) hidden]: the final feature first;
    # ONNX Runtime runners on a graph with the `hidden_layers` output, ort/layer_outputs.py); 0: none
    hidden_layers: int = 0
    # Calls of fewer tokens run as this many rows, the last token repeated, and return only the real rows; the
    # extra rows land in cache rows past the committed length, which the next call overwrites. 2 for a quantized
    # target at MatMulNBits accuracy level 4 (`ModelEntry.ort_min_rows`): ONNX Runtime's one-row and several-row
    # int8 kernels round differently, and with every call on the several-row kernel a verify pass and one-token
    # decoding agree.
    min_rows: int = 1
    # whether `forward` takes a token tree (`parents`): the runner's graph has the tree input (docs/trees.md)
    supports_tree: bool = False
    tree_max_rows: int = 1 << 30  # most rows of one tree pass (a windowed fused graph: its window)

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def set_argmax_only(self, on: bool) -> None:
        """See the module docstring; a runner without a screened head returns full rows either way."""

    closed: bool = False
    # attributes holding native objects and buffers (sessions, bindings, contexts, device memory): `close` drops
    # them, in this order (TensorRT: contexts before their engine), so the backend frees them
    native: tuple[str, ...] = ()

    def close(self) -> None:
        """Release what the backend holds (`_release`: its session, bindings, buffers, KV cache). Idempotent."""
        if not self.closed:
            self.closed = True
            self._release()

    def _release(self) -> None:
        """Drop the backend's native objects (`native`) and the KV cache."""
        for name in self.native:
            if name in self.__dict__:
                setattr(self, name, None)
        self.hidden_states = None
        self.cache = _ClosedCache(self.cache.capacity)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def reset(self) -> None:
        self.cache.truncate(0)

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)

    def forward(self, token_ids: np.ndarray, parents: np.ndarray | None = None) -> np.ndarray:
        """token_ids: [S] int64 -> logits [S, V] float32; appends S positions to the cache. `parents` ([S-1]
        int64, optional): the rows form a token tree (module docstring); a chain's parents run as a chain.

        The template every backend shares: check the call in Python (shape, context capacity), run the
        backend's `_forward` with the past length P, then commit the S new rows to the cache.
        """
        past = self._check(token_ids)
        s = token_ids.size
        if parents is not None and not is_chain(parents):
            if not self.supports_tree:
                raise InvalidArgument(f"the {self.name} runner's graph has no tree input (a bundle compiled before "
                                      "token trees, or a backend without them): verify chains only")
            check_parents(parents, s - 1)
            logits = self._forward_tree(token_ids, past, ancestor_mask(parents), past + depths(parents))
            self.cache.length = past + s
            return logits
        if s < self.min_rows and past + self.min_rows <= self.capacity:
            # a shorter call runs as min_rows rows (the last token repeated): see `min_rows` above
            logits = self._forward(pad_rows(token_ids, self.min_rows), past)[:s]
            if self.hidden_states is not None:
                self.hidden_states = self.hidden_states[:s]
        else:
            logits = self._forward(token_ids, past)
        self.cache.length = past + s
        return logits

    def keep_path(self, past: int, rows: list[int]) -> None:
        """After a tree pass at past length `past`: keep the cache rows past + r (r in `rows`, ascending) at
        past + 1, past + 2, ... (the accepted path; row 0, the root, stays). Truncate afterwards."""
        self.cache.compact(past + 1, [past + r for r in rows])

    def _forward_tree(self, token_ids: np.ndarray, past: int, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """token_ids [S], mask [S, S] bool (ancestor or self), positions [S] (past + depth) -> logits [S, V]; the
        new rows land at cache rows [past, past + S) as in `_forward`. Runners with `supports_tree` override it."""
        raise InvalidArgument(f"the {self.name} runner does not verify token trees")

    def prefill(self, token_ids: np.ndarray, chunk: int = 256) -> np.ndarray:
        """Feed token_ids in chunks of at most `chunk` (bounded logits memory, within the prefill
        profile); return the last position's logits [V]."""
        logits = None
        for start in range(0, token_ids.size, chunk):
            logits = self.forward_last(token_ids[start:start + chunk])
        return logits

    def forward_last(self, token_ids: np.ndarray) -> np.ndarray:
        """Like `forward`, but returns only the last position's logits [V] (the same template)."""
        past = self._check(token_ids)
        row = self._forward_last(token_ids, past)
        self.cache.length = past + token_ids.size
        return row

    def _check(self, token_ids: np.ndarray) -> int:
        """Shape and context capacity, in Python before any native code; returns the past length P."""
        if self.closed:
            raise GeneratorClosed(f"this {self.name} runner is closed: load the bundle again")
        if token_ids.ndim != 1 or token_ids.size == 0:
            raise InvalidArgument(f"forward needs a non-empty 1-D array of token ids, got shape {token_ids.shape}")
        self.cache.reserve(token_ids.size)
        return self.cache.length

    def _forward_last(self, token_ids: np.ndarray, past: int) -> np.ndarray:
        """The last row of `_forward`. Runners whose graph can skip the other rows' logits (the lm_head over
        the whole vocabulary) override this."""
        return self._forward(token_ids, past)[-1]

    @abc.abstractmethod
    def _forward(self, token_ids: np.ndarray, past: int) -> np.ndarray:
        """token_ids: [S] int64 at positions [past, past + S) -> logits [S, V] float32 (a view valid until
        the next call). Writes the S new key/value rows at rows [past, past + S) of the cache (see
        `KVCache.row_offset`) and sets `hidden_states` when the runner wants them. Called only after the
        checks in `forward`; the cache length is committed by `forward`."""

    def describe(self) -> dict[str, Any]:
        """Backend facts for stats and `inspect` (provider actually in use, device, dtype)."""
        return {"backend": self.name}


class _ClosedCache:
    """A closed runner's cache: no rows (its buffers are released); `length` 0."""

    length = 0

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    def truncate(self, length: int) -> None:
        """Nothing to truncate."""
