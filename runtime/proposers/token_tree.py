"""One draft tree per step, merged from every source's branches (a trie under the pending last token).

    trie = DraftTrie(budget=8)
    trie.add_path([5, 9, 2])            # a branch (n-gram continuation): shared prefixes are stored once
    expand_template(trie, table, last_token, template(8), eos_ids)   # the successor table's static tree
    token_ids, parents = trie.arrays()  # [n] int64 each; parents[i] < i, -1 = the root

Nodes are kept in creation order, so every parent precedes its children (topological order, as the verify
pass's tree mask wants); the trie never holds more than `budget` nodes nor two equal siblings (dedupe).
`first_chain()` is the path of first children: the tree's best branch, by the order branches were added
(a loop without tree verification verifies that chain).

The static template (Token Recycling's tree, arXiv 2408.08696) is a set of rank paths, e.g. (0,), (1,),
(0, 0): node (0, 1) is the second successor of the first successor of the root. `template(n)` takes the n
paths of highest prior weight, where a path's weight is the product of a fixed per-rank prior: prefix-closed
and ordered best first (every path after its prefix). The prior is a property of ranks, not of any
benchmark's text.
"""

from __future__ import annotations

import functools
import heapq

import numpy as np

RANK_PRIOR = (0.55, 0.17, 0.09, 0.06, 0.045, 0.035, 0.03, 0.025)  # P(the target's next token is rank r)
MAX_TEMPLATE_DEPTH = 8


class DraftTrie:
    def __init__(self, budget: int, max_depth: int | None = None) -> None:
        self.budget = max(int(budget), 0)
        self.max_depth = max_depth if max_depth is not None else self.budget
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depth: list[int] = []
        self._child: dict[tuple[int, int], int] = {}  # (parent index, token) -> node index

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.budget

    def add(self, parent: int, token: int) -> int | None:
        """The node for `token` under `parent` (-1: the root): the existing one, a new one, or None when the
        budget or the depth limit leaves no room."""
        key = (parent, int(token))
        node = self._child.get(key)
        if node is not None:
            return node
        depth = 1 if parent < 0 else self.depth[parent] + 1
        if self.full or depth > self.max_depth:
            return None
        self._child[key] = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depth.append(depth)
        return self._child[key]

    def add_path(self, tokens, parent: int = -1) -> int:
        """Insert a branch under `parent`; returns how many of its tokens are in the trie (a prefix)."""
        placed = 0
        for t in tokens:
            parent = self.add(parent, t)
            if parent is None:
                break
            placed += 1
        return placed

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.tokens, dtype=np.int64), np.array(self.parents, dtype=np.int64)

    def first_chain(self) -> list[int]:
        """The path of first children from the root (the first-added branch)."""
        out, node = [], -1
        while True:
            child = next((i for i in range(node + 1, len(self.tokens)) if self.parents[i] == node), None)
            if child is None:
                return out
            out.append(self.tokens[child])
            node = child


@functools.lru_cache(maxsize=64)
def template(n: int, ranks: int = len(RANK_PRIOR)) -> tuple[tuple[int, ...], ...]:
    """The n rank paths of highest prior weight (depth <= MAX_TEMPLATE_DEPTH), best first, prefix-closed."""
    prior = RANK_PRIOR[:ranks]
    out: list[tuple[int, ...]] = []
    heap = [(-prior[r], (r,)) for r in range(len(prior))]
    heapq.heapify(heap)
    while heap and len(out) < n:
        neg, path = heapq.heappop(heap)
        out.append(path)
        if len(path) < MAX_TEMPLATE_DEPTH:
            for r, w in enumerate(prior):
                heapq.heappush(heap, (neg * w, path + (r,)))
    return tuple(out)


def expand_template(trie: DraftTrie, succ: np.ndarray, root_token: int, paths, eos_ids=frozenset()) -> None:
    """Add the successor table's tree: path p's token is succ[token of p's parent][p[-1]]; a path whose parent
    is missing (unknown successor, an EOS, out of budget) is skipped with its subtree. `succ`: int32 [V, K]."""
    node_of: dict[tuple[int, ...], int] = {(): -1}
    token_of: dict[tuple[int, ...], int] = {(): int(root_token)}
    k = succ.shape[1]
    for p in paths:
        if trie.full:
            return
        head = p[:-1]
        parent = node_of.get(head)
        if parent is None or p[-1] >= k or token_of[head] in eos_ids:
            continue
        tok = int(succ[token_of[head], p[-1]])
        if tok < 0:
            continue
        node = trie.add(parent, tok)
        if node is not None:
            node_of[p], token_of[p] = node, tok
