"""The acceptance rule (rejection sampler): pure functions of arrays and an explicit random generator.

Names follow Leviathan et al. (2023) and Chen et al. (2023): the proposer drafted tokens d_1..d_k with
draft distributions p_1..p_k; one target pass gave q_1..q_{k+1}.

* accepted token: d_i kept because every d_j, j <= i, passed the test (greedy: d_i == argmax q_i;
  sampling: u < min(1, q_i(d_i) / p_i(d_i))).
* recovered token: emitted at the first rejection i instead of d_i; greedy: argmax q_i; sampling: drawn
  from norm(max(q_i - p_i, 0)).
* bonus token: emitted when all k drafts are accepted; greedy: argmax q_{k+1}; sampling: drawn from q_{k+1}.

Each call therefore emits `num_accepted` drafts plus exactly one recovered or bonus token. A proposer
without probabilities (n-gram, Medusa greedy heads) is a point mass: pass `draft_probs=None`.
The emitted tokens are distributed exactly as target-only sampling (lossless).
"""

from __future__ import annotations

import numpy as np

from specrt.runtime.sampling import sample


def greedy_accept(draft_token_ids: np.ndarray, target_logits: np.ndarray,
                  target_ids: list[int] | None = None) -> tuple[int, int]:
    """draft_token_ids [k], target_logits [k+1, V] -> (num_accepted, recovered or bonus token).

    k is small (<= max_draft_tokens): the first mismatch is found in Python on k + 1 argmaxes, which costs
    less per step than NumPy's vectorised compare for such sizes (a plain step, k = 0, is one argmax).
    `target_ids` [k+1] (optional): the rows' argmax already computed, exactly `target_logits.argmax(-1)`."""
    if target_ids is None:
        if draft_token_ids.size == 0:
            return 0, int(target_logits[0].argmax())
        target_ids = target_logits.argmax(axis=-1).tolist()  # [k+1]
    for j, d in enumerate(draft_token_ids.tolist()):
        if d != target_ids[j]:
            return j, target_ids[j]
    return len(target_ids) - 1, target_ids[-1]


def rejection_sample(draft_token_ids: np.ndarray, draft_probs: np.ndarray | None, target_probs: np.ndarray,
                     rng: np.random.Generator) -> tuple[int, int]:
    """draft_token_ids [k], draft_probs [k, V] or None (point mass), target_probs [k+1, V] -> (j, token).

    Both distributions must come from the same warping (temperature / top-k / top-p).
    """
    k = draft_token_ids.size
    for i in range(k):
        d = int(draft_token_ids[i])
        q = target_probs[i]
        p_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if p_d > 0 and rng.random() * p_d < q[d]:  # u < q(d) / p(d), without dividing
            continue
        if draft_probs is None:
            residual = q.copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(q - draft_probs[i], 0.0)
        if residual.sum() <= 0:  # q == p exactly: any draw from q is correct (rejection had probability 0)
            residual = q
        return i, sample(residual, rng)
    return k, sample(target_probs[k], rng)


# --- token trees (runtime/tree.py, docs/trees.md) ---------------------------------------------------------------
# A tree step verified rows 0..k' (row 0 the root, row i + 1 draft i) and gives target_logits / target_probs
# [k' + 1, V]. Both rules return (path, token): `path` the accepted draft indices, root to leaf (len(path) = number
# of accepted drafts), `token` the recovered or bonus token drawn at the last accepted row.


def greedy_accept_tree(draft_token_ids: np.ndarray, parents: np.ndarray, target_logits: np.ndarray,
                       target_ids: list[int] | None = None) -> tuple[list[int], int]:
    """draft_token_ids [k'], parents [k'], target_logits [k'+1, V] -> (path, recovered or bonus token).

    The longest root path whose every token equals the target's argmax at its parent row (the first matching
    child, in proposal order, where siblings repeat a token); then argmax at the path's last row. `target_ids`
    (optional): the rows' argmax already computed, exactly `target_logits.argmax(-1)`."""
    from specrt.runtime.tree import children

    if target_ids is None:
        target_ids = target_logits.argmax(axis=-1).tolist()  # [k'+1]
    kids, tokens = children(parents), draft_token_ids.tolist()
    path, row = [], 0
    while True:
        nxt = next((c for c in kids[row] if tokens[c - 1] == target_ids[row]), None)
        if nxt is None:
            return path, target_ids[row]
        path.append(nxt - 1)
        row = nxt


def rejection_sample_tree(draft_token_ids: np.ndarray, parents: np.ndarray, target_probs: np.ndarray,
                          rng: np.random.Generator) -> tuple[list[int], int]:
    """Point-mass drafts (n-gram, table, greedy heads) on a tree: draft_token_ids [k'], parents [k'],
    target_probs [k'+1, V] -> (path, token). Lossless multi-candidate rejection (SpecInfer, arXiv 2305.09781,
    for point-mass drafts): at row r with target distribution q_r, the residual q' starts as q_r; each child c in
    order is accepted with probability q'(d_c) (= min(1, q'(d_c) / p(d_c)) with p = delta at d_c); on rejection
    q' <- norm(q' with d_c zeroed). The first accepted child becomes the row and the walk continues; when every
    child was rejected the recovered token is drawn from q' (a leaf's bonus token from q_r).
    Sampled (draft-model) trees are not handled here: the loop verifies their first chain (docs/trees.md)."""
    from specrt.runtime.tree import children

    kids, tokens = children(parents), draft_token_ids.tolist()
    path, row = [], 0
    while True:
        residual = target_probs[row]
        accepted = None
        for c in kids[row]:
            d = tokens[c - 1]
            total = float(residual.sum())
            if total > 0 and rng.random() * total < residual[d]:  # u < q'(d) with q' = residual / total
                accepted = c
                break
            if residual is target_probs[row]:
                residual = residual.copy()
            residual[d] = 0.0
        if accepted is None:
            if residual.sum() <= 0:  # every token of q_r's support was drafted and rejected: probability 0
                residual = target_probs[row]
            return path, sample(residual, rng)
        path.append(accepted - 1)
        row = accepted
