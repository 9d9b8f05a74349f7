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


def greedy_accept(draft_token_ids: np.ndarray, target_logits: np.ndarray) -> tuple[int, int]:
    """draft_token_ids [k], target_logits [k+1, V] -> (num_accepted, recovered or bonus token).

    k is small (<= max_draft_tokens): the first mismatch is found in Python on k + 1 argmaxes, which costs
    less per step than NumPy's vectorised compare for such sizes (a plain step, k = 0, is one argmax)."""
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
