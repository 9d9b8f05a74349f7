"""A retrieval datastore of the target's own text (REST, arXiv 2311.08252): the continuations that followed the
context's last 1-4 tokens in a corpus, merged into a small token tree by how often each continuation occurs.

    store = Datastore.from_sequences([answer_ids, ...])   # int arrays of token ids (the target's own answers)
    nodes = store.tree(context, n, depth=8, budget=24)    # [(parent, token, count / parent's count, match), ...]

Layout (compact, numpy only): `corpus` int32 [N] holds the sequences, each followed by SEP (-1); `order` int32 [M]
holds every non-SEP position sorted lexicographically by the (up to) 4 tokens that start there (id + 1 each, SEP and
past-the-end = 0), so every suffix of length L <= 4 is one contiguous range of `order`. In memory a position's key
packs as many of those tokens as fit into one uint64 (`bits` = 16 each below 65,535 ids: all 4; 17-21 bits, up to
2M ids: 3; up to 2^31: 2) and the rest are uint32 tail columns; a lookup is two `searchsorted` calls on the keys and
two more per tail token inside the range found (O(log N)). The stored order does not depend on the packing: stores
written by any version load, and any vocabulary fits (ids below 2^31 - 2). Measured (1M Zipf tokens, 4-token
lookups, 2 busy cores): 33 us with 4 packed tokens (vocab 49k), 59 us with 3 + 1 tail column (150k), 72 us with
2 + 2 (5M); four uint32 columns and no packed key (np.lexsort alone) took 78-93 us at every vocabulary size.

The bundle may carry one (`store/corpus.npy`, `store/order.npy`; `specrt store` writes them: store_sources.py reads
its sources, store_write.py writes), listed in the manifest with their sha256; `load_store` checks the hashes,
dtypes, id range and order, raising BundleError naming the fix; `store_for(gen)` keeps one per loaded bundle
(threads share it: its arrays are read-only, its memo of recent trees takes a lock). `auto` merges its tree as the
source `store` (`add_nodes`), alone and under batching.

A lookup takes the longest suffix of the context (MAX_MATCH down to `min_match` tokens) found at least once
(`longest`: every length's key range from one pair of `searchsorted` calls), reads the continuations after (at most
MAX_ROWS of) its occurrences, and grows the tree heaviest path first (store_tree.py `grow`): a node's weight is the
share of those occurrences whose continuation starts with its path. A continuation stops at the end of its sequence
and before an EOS. The tree depends only on the range found, depth, budget and EOS ids: the last MEMO trees are kept
under that key (short contexts of frequent tokens recur). Per lookup, thread CPU on SmolLM2's 721k-token store
(scripts/store_profile.py, the tuning questions' `auto` lookups replayed, 2 busy cores): 0.15 ms against 0.87 before
the arrays and the memo (0.19-0.22 without the memo; the same nodes, checked on every lookup replayed and by
tests/runtime/test_store_tree.py against a reference).
"""

from __future__ import annotations

import collections
import threading
import weakref

import numpy as np

from specrt.core.errors import BundleError, InvalidArgument
from specrt.runtime.proposers.store_tree import SEP, grow

MAX_MATCH = 4  # tokens of context matched
MAX_ROWS = 256  # occurrences read per lookup (evenly spaced over the match range: the shares are kept)
BITS = 16  # bits per token in a key at least (4 tokens in a uint64); more for larger vocabularies
MAX_ID = (1 << 31) - 2  # token ids are stored as int32, id + 1 must fit too
MEMO = 256  # trees kept (frequent short contexts recur: half the 256-row lookups of the tuning runs)
STORE_NODES = 24  # the datastore's candidates per auto step
CORPUS_FILE, ORDER_FILE = "store/corpus.npy", "store/order.npy"  # relative to the bundle root


def key_bits(max_id: int) -> int:
    """Bits per token in a key: enough for id + 1 (SEP = 0) of ids up to `max_id`, at least 16 (4 tokens a key)."""
    return max(BITS, int(max_id + 1).bit_length())


class Datastore:
    def __init__(self, corpus: np.ndarray, order: np.ndarray | None = None) -> None:
        corpus = np.asarray(corpus)
        if corpus.ndim != 1 or corpus.dtype.kind not in "iu":
            raise InvalidArgument(f"a datastore corpus is a 1-D integer array, got {corpus.dtype} {corpus.shape}")
        if corpus.size and (int(corpus.min()) < SEP or int(corpus.max()) >= MAX_ID):
            raise InvalidArgument(f"datastore token ids must lie in [0, {MAX_ID}) (SEP = -1), got "
                                  f"[{int(corpus.min())}, {int(corpus.max())}]")
        self.corpus = corpus.astype(np.int32, copy=False)  # [N]
        self.max_id = int(self.corpus.max()) if self.corpus.size else 0
        self._memo: collections.OrderedDict = collections.OrderedDict()  # `tree`'s last MEMO results
        self._memo_lock = threading.Lock()
        self.sep_end = bool(self.corpus.size) and int(self.corpus[-1]) == SEP  # from_sequences' and `specrt store`'s
        self.bits = key_bits(self.max_id)
        self.packed = min(MAX_MATCH, 64 // self.bits)  # tokens in the uint64 key; the rest are tail columns
        keys, tails = self._columns()
        if order is None:
            valid = np.flatnonzero(self.corpus != SEP)
            # lexicographic by the MAX_MATCH tokens from each position: the same order whatever the packing
            order = valid[np.lexsort([t[valid] for t in reversed(tails)] + [keys[valid]])].astype(np.int32)
        order = np.asarray(order, dtype=np.int32)
        if order.size and (int(order.min()) < 0 or int(order.max()) >= self.corpus.size):
            raise InvalidArgument(f"datastore order holds positions outside [0, {self.corpus.size})")
        self.order = order  # [M] positions sorted by their MAX_MATCH tokens
        self.sorted_keys = keys[order]  # [M] uint64, ascending: the first `packed` tokens
        self.sorted_tails = [t[order] for t in tails]  # [M] uint32 each: token `packed + i` (+ 1), within equal keys
        if not self._is_sorted():
            raise InvalidArgument("datastore order is not sorted by key: rebuild the datastore")

    @classmethod
    def from_sequences(cls, sequences) -> "Datastore":
        parts = []
        for seq in sequences:
            seq = np.asarray(seq, dtype=np.int64).reshape(-1)
            if seq.size:
                parts += [seq, np.array([SEP])]
        return cls(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32))

    @property
    def nbytes(self) -> int:
        return int(self.corpus.nbytes + self.order.nbytes + self.sorted_keys.nbytes +
                   sum(t.nbytes for t in self.sorted_tails))

    def _columns(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """([N] uint64 keys: the first `packed` tokens from each position, `bits` each; [N] uint32 per further token
        up to MAX_MATCH). Every token as id + 1; SEP and past-the-end = 0."""
        c = np.concatenate([self.corpus, np.full(MAX_MATCH - 1, SEP, dtype=np.int32)]).astype(np.int64) + 1
        n = self.corpus.size
        keys = np.zeros(n, dtype=np.uint64)
        for i in range(self.packed):
            keys |= c[i:i + n].astype(np.uint64) << np.uint64(self.bits * (self.packed - 1 - i))
        return keys, [c[i:i + n].astype(np.uint32) for i in range(self.packed, MAX_MATCH)]

    def _is_sorted(self) -> bool:
        """Whether (sorted_keys, *sorted_tails) is in lexicographic order."""
        if self.sorted_keys.size < 2:
            return True
        ahead = np.zeros(self.sorted_keys.size - 1, dtype=bool)  # strictly greater than the previous row so far
        equal = np.ones_like(ahead)
        for col in [self.sorted_keys] + self.sorted_tails:
            ahead |= equal & (col[1:] > col[:-1])
            equal &= col[1:] == col[:-1]
        return bool((ahead | equal).all())

    def match(self, suffix) -> tuple[int, int]:
        """The range [lo, hi) of `order` whose positions start with `suffix` (1..MAX_MATCH token ids): one pair of
        binary searches over the packed keys, one more per token past them (within the range found so far)."""
        suffix = [int(t) for t in suffix]
        if not 1 <= len(suffix) <= MAX_MATCH or min(suffix) < 0 or max(suffix) > self.max_id:
            return 0, 0
        v, last = self._bounds(suffix)
        lo = int(np.searchsorted(self.sorted_keys, np.uint64(v), side="left"))
        hi = int(np.searchsorted(self.sorted_keys, np.uint64(last), side="right"))
        return self._narrow(lo, hi, suffix)

    def _bounds(self, suffix: list[int]) -> tuple[int, int]:
        """The smallest and largest packed key of a position starting with suffix[:packed]."""
        head = suffix[:self.packed]
        v = 0
        for i, t in enumerate(head):
            v |= (t + 1) << (self.bits * (self.packed - 1 - i))
        return v, v + (1 << (self.bits * (self.packed - len(head)))) - 1

    def _narrow(self, lo: int, hi: int, suffix: list[int]) -> tuple[int, int]:
        """[lo, hi) narrowed by suffix[packed:] on the tail columns."""
        for col, t in zip(self.sorted_tails, suffix[self.packed:]):
            if hi <= lo:
                break
            part, v = col[lo:hi], np.uint32(t + 1)  # same dtype: searchsorted would copy `part` to cast it
            lo, hi = lo + int(np.searchsorted(part, v, side="left")), lo + int(np.searchsorted(part, v, side="right"))
        return lo, hi

    def longest(self, tokens: np.ndarray, n: int, min_match: int = 1) -> tuple[int, int, int]:
        """(L, lo, hi): the longest suffix of tokens[:n] of MAX_MATCH down to `min_match` tokens found in the corpus
        and its range of `order` ((0, 0, 0): none), as `match` finds it per length, every length's packed-key range
        from one pair of `searchsorted` calls."""
        ctx = np.asarray(tokens[max(n - MAX_MATCH, 0):n]).tolist()
        bad = [i for i, t in enumerate(ctx) if not 0 <= t <= self.max_id]  # a suffix holding one matches nothing
        sizes = range(len(ctx) - 1 - bad[-1] if bad else len(ctx), max(min_match, 1) - 1, -1)
        if not sizes:
            return 0, 0, 0
        bounds = [self._bounds(ctx[len(ctx) - size:]) for size in sizes]
        los = np.searchsorted(self.sorted_keys, np.array([b[0] for b in bounds], np.uint64), side="left").tolist()
        his = np.searchsorted(self.sorted_keys, np.array([b[1] for b in bounds], np.uint64), side="right").tolist()
        for size, lo, hi in zip(sizes, los, his):
            if self.sorted_tails and size > self.packed:
                lo, hi = self._narrow(lo, hi, ctx[len(ctx) - size:])
            if hi > lo:
                return size, lo, hi
        return 0, 0, 0

    def _rows(self, size: int, lo: int, hi: int, depth: int) -> np.ndarray:
        """[R, depth] the corpus tokens after (at most MAX_ROWS of) the occurrences order[lo:hi] of a suffix of `size`
        tokens, SEP past the corpus's end; not cut at the first SEP."""
        if not size:
            return np.zeros((0, depth), dtype=np.int32)
        pick = np.arange(lo, hi) if hi - lo <= MAX_ROWS else np.linspace(lo, hi - 1, MAX_ROWS).astype(np.int64)
        idx = self.order[pick][:, None] + np.arange(size, size + depth)  # [R, depth] int64
        if self.sep_end:  # past the end: the last token, a SEP
            return self.corpus.take(idx, mode="clip")
        return np.where(idx < self.corpus.size, self.corpus[np.minimum(idx, self.corpus.size - 1)], SEP)

    def tree(self, tokens: np.ndarray, n: int, depth: int, budget: int, eos_ids=frozenset(),
             min_match: int = 1) -> list[tuple[int, int, float, int]]:
        """Up to `budget` nodes (parent index or -1, token, count / parent's count, matched length), parents first,
        heaviest paths first (a path's weight: the share of the occurrences it continues; store_tree.py). The trees
        of the last MEMO lookups are kept, keyed by what decides them (the range found, depth, budget, EOS ids)."""
        size, lo, hi = self.longest(tokens, n, min_match) if budget >= 1 and depth >= 1 else (0, 0, 0)
        if not size:
            return []
        key = (size, lo, hi, depth, budget, frozenset(eos_ids))
        with self._memo_lock:
            nodes = self._memo.get(key)
            if nodes is not None:
                self._memo.move_to_end(key)
                return list(nodes)
        nodes = tuple(grow(self._rows(size, lo, hi, depth), budget, size, eos_ids))  # stops rows at a SEP
        with self._memo_lock:
            self._memo[key] = nodes
            if len(self._memo) > MEMO:
                self._memo.popitem(last=False)
        return list(nodes)


def add_nodes(store: Datastore, add, tokens: np.ndarray, n: int, depth: int, conf_bin, eos_ids=frozenset(),
              budget: int = STORE_NODES) -> None:
    """Merge `store`'s tree for tokens[:n] into auto's trie through `add(parent, token, key) -> node | None`; key
    (`storeL` for a match of 3+ tokens, else `store`; depth; `conf_bin(count / parent's count)`: auto's bins)."""

    where: list[int | None] = []  # the trie node of each of the store's nodes (None: not placed)
    depths: list[int] = []
    for parent, tok, cond, size in store.tree(tokens, n, depth, budget, eos_ids):
        par = -1 if parent < 0 else where[parent]
        depths.append(1 if parent < 0 else depths[parent] + 1)
        where.append(None if par is None else
                     add(par, tok, ("storeL" if size >= 3 else "store", depths[-1], conf_bin(cond))))


def load_store(manifest, vocab_size: int) -> Datastore | None:
    """The bundle's datastore, checked (sha256, dtype, id range, order), or None when it has none."""
    have = [rel for rel in (CORPUS_FILE, ORDER_FILE) if rel in manifest.files]
    if not have:
        return None
    if len(have) == 1:
        raise BundleError(f"the bundle lists {have[0]} without its pair ({CORPUS_FILE}, {ORDER_FILE}): rebuild the "
                          "datastore with `specrt store`")
    from specrt.bundle.manifest import verify_files

    verify_files(manifest, [CORPUS_FILE, ORDER_FILE])  # ChecksumMismatch when a file was modified or is missing
    try:
        corpus = np.load(manifest.path(CORPUS_FILE), allow_pickle=False)
        order = np.load(manifest.path(ORDER_FILE), allow_pickle=False)
        if corpus.dtype != np.int32 or order.dtype != np.int32:
            raise InvalidArgument(f"int32 arrays expected, got {corpus.dtype} and {order.dtype}")
        if corpus.size and int(corpus.max()) >= vocab_size:
            raise InvalidArgument(f"token id {int(corpus.max())} outside the target's vocabulary of {vocab_size}")
        return Datastore(corpus, order)
    except (OSError, ValueError, InvalidArgument) as exc:
        raise BundleError(f"cannot read the bundle's datastore ({CORPUS_FILE}, {ORDER_FILE}): {exc}; rebuild it "
                          "with `specrt store`") from None


_STORES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_STORES_LOCK = threading.Lock()


def store_for(gen) -> Datastore | None:
    """The datastore of `gen`'s bundle (loaded and checked on first use, dropped with the Generator), or None."""
    with _STORES_LOCK:
        if gen not in _STORES:
            _STORES[gen] = load_store(gen.manifest, gen.vocab_size)
        return _STORES[gen]
