"""`PrefixStore`: the KV rows of token blocks, kept across requests (prefix caching: runtime/batch/prefix_cache.py).

A token sequence is cut into blocks of `block` tokens. Block i's key is a hash of block i-1's key and block i's
token ids (a hash chain, as vLLM's automatic prefix caching), so two equal keys stand for two equal whole prefixes
up to the end of that block. Each stored block holds a copy of its KV rows, every layer: `[2L, Hkv, block, D]` fp32
(the L key buffers, then the L value buffers), never a view of a region (regions move and are reused).

The store has a budget in bytes; the least recently used blocks are evicted first. A lookup or an insertion touches
a chain from its last block to its first, so a prefix's later blocks are older than its earlier ones and go first (a
block whose parent was evicted could never be matched again).
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np

from specrt.core.errors import InvalidArgument

DEFAULT_BLOCK = 16  # tokens per block (vLLM's default block size)


class PrefixStore:
    def __init__(self, budget_bytes: int, block: int = DEFAULT_BLOCK) -> None:
        if not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise InvalidArgument(f"prefix cache budget must be an integer number of bytes >= 0, got {budget_bytes!r}")
        if not isinstance(block, int) or block < 1:
            raise InvalidArgument(f"prefix cache block must be >= 1 token, got {block!r}")
        self.budget_bytes, self.block = budget_bytes, block
        self._blocks: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()  # LRU first
        self.used_bytes = 0
        self.evicted = 0  # blocks evicted since start

    def __len__(self) -> int:
        return len(self._blocks)

    def chain(self, ids: np.ndarray, limit: int | None = None) -> list[bytes]:
        """The keys of ids' full blocks (at most `limit` of them): key i covers ids[: (i + 1) * block]."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.size // self.block if limit is None else min(limit, ids.size // self.block)
        keys, parent = [], b""
        for i in range(n):
            parent = hashlib.blake2b(parent + ids[i * self.block:(i + 1) * self.block].tobytes(),
                                     digest_size=16).digest()
            keys.append(parent)
        return keys

    def match(self, ids: np.ndarray) -> list[bytes]:
        """The keys of the longest stored prefix of ids' full blocks (touched: most recently used)."""
        keys = self.chain(ids)
        n = 0
        while n < len(keys) and keys[n] in self._blocks:
            n += 1
        self._touch(keys[:n])
        return keys[:n]

    def rows(self, keys: list[bytes]) -> list[np.ndarray]:
        """The stored blocks of `keys` (each [2L, Hkv, block, D]; read-only: copy out, never write)."""
        return [self._blocks[k] for k in keys]

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def put(self, key: bytes, rows: np.ndarray) -> bool:
        """Store a block's rows (a copy of them is the caller's to give: kept as is). Evicts least recently used
        blocks to stay within the budget; False (nothing stored) when one block alone is over the budget."""
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return True
        size = rows.nbytes
        if size > self.budget_bytes:
            return False
        while self.used_bytes + size > self.budget_bytes:
            _, old = self._blocks.popitem(last=False)
            self.used_bytes -= old.nbytes
            self.evicted += 1
        rows.flags.writeable = False
        self._blocks[key] = rows
        self.used_bytes += size
        return True

    def touch(self, keys: list[bytes]) -> None:
        """Mark a chain most recently used, its first block last (the most recent of all)."""
        self._touch([k for k in keys if k in self._blocks])

    def _touch(self, keys: list[bytes]) -> None:
        for k in reversed(keys):
            self._blocks.move_to_end(k)

    def clear(self) -> None:
        self._blocks.clear()
        self.used_bytes = 0
