"""Token trees (docs/trees.md): pure helpers on a proposal's `parents` array.

A tree proposal drafts k' tokens `token_ids [k']` with `parents [k']` (int64): `parents[i]` is the index in
`token_ids` of draft i's parent, or -1 when its parent is the root, the pending last committed token. Nodes are
in topological order (`parents[i] < i`), so any prefix of a tree is a tree. A chain is parents = [-1, 0, 1, ...].

A verify pass feeds S = k' + 1 rows: row 0 is the root, row i + 1 is draft i. Row r's parent row is
`parents[r - 1] + 1` (0 for the root's children); its position is past + depth(r).
"""

from __future__ import annotations

import numpy as np


def check_parents(parents: np.ndarray, size: int) -> None:
    """Raise ValueError unless `parents` is a valid [size] topological parents array."""
    if parents.ndim != 1 or parents.size != size:
        raise ValueError(f"parents must have shape [{size}] (one per draft token), got {parents.shape}")
    if parents.dtype.kind not in "iu":
        raise ValueError(f"parents must be an integer array, got dtype {parents.dtype}")
    if size:
        idx = np.arange(size)
        bad = np.flatnonzero((parents < -1) | (parents >= idx))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"parents[{i}] = {int(parents[i])}: a draft's parent must be -1 (the root) or an "
                             f"earlier draft (topological order, parents[i] < i)")


def is_chain(parents: np.ndarray | None) -> bool:
    return parents is None or bool(np.array_equal(parents, np.arange(-1, parents.size - 1)))


def parent_rows(parents: np.ndarray) -> np.ndarray:
    """[k'] -> [S] parent row of every verify row (row 0, the root, has -1)."""
    return np.concatenate([[-1], parents + 1]).astype(np.int64)


def ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """[k'] -> [S, S] bool: mask[i, j] true when row j is row i or one of its ancestors (what row i attends to
    among the new rows). O(S^2)."""
    s = parents.size + 1
    mask = np.zeros((s, s), dtype=np.bool_)
    mask[0, 0] = True
    for i, p in enumerate(parents.tolist(), start=1):
        mask[i] = mask[p + 1]
        mask[i, i] = True
    return mask


def depths(parents: np.ndarray) -> np.ndarray:
    """[k'] -> [S] depth of every row (root 0)."""
    d = np.zeros(parents.size + 1, dtype=np.int64)
    for i, p in enumerate(parents.tolist(), start=1):
        d[i] = d[p + 1] + 1
    return d


def children(parents: np.ndarray) -> list[list[int]]:
    """[k'] -> per row, its child rows in proposal order."""
    kids: list[list[int]] = [[] for _ in range(parents.size + 1)]
    for i, p in enumerate(parents.tolist(), start=1):
        kids[p + 1].append(i)
    return kids


def first_chain(parents: np.ndarray) -> np.ndarray:
    """Draft indices of the path of first children from the root (what a runner without tree support
    verifies)."""
    kids = children(parents)
    path, row = [], 0
    while kids[row]:
        row = kids[row][0]
        path.append(row - 1)
    return np.asarray(path, dtype=np.int64)
