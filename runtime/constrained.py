"""The constrained verify step: drafts checked against the constraint, forced tokens appended, masks computed
in a thread while the target runs.

Per step (runtime/loop.py), with the constraint's state at the committed tokens:
1. `shape_proposal`: the proposal is cut at its first token the constraint refuses (every proposer goes
   through this one check). A point-mass draft (n-gram, Medusa, a greedy draft model) is cut before that
   token. A sampled draft keeps it as the last draft but not in the verify pass: the target's masked
   q(d) = 0 there, so the rejection rule rejects it for sure and draws from norm(max(q - p, 0)), exactly as if
   it had been verified (cutting it and drawing from q instead would not be lossless).
   When the (uncut) proposal ends where the constraint admits one continuation, its tokens are appended:
   forced tokens, verified in the same pass (a point mass; `Proposal` rows of probability 1 when sampled).
2. `MaskWorker.submit(constraint.masks, verify_ids)` computes the k+1 masks (row i after verify_ids[:i]) in a
   thread; ONNX Runtime and llguidance both release the GIL, so the mask cost hides behind the target pass.
3. The target's logits are masked (`masked_logits`): every verified position's distribution is the masked one,
   so greedy output equals constrained plain decoding and sampling is lossless with respect to it.
4. The constraint rolls back the rejected tokens and consumes the recovered or bonus token.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

from specrt.runtime.constraint import Constraint


class MaskWorker:
    """One thread that computes masks beside the target pass (one per Generator; requests run one at a time)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specrt-mask")

    def submit(self, fn: Callable[..., np.ndarray], *args) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


@dataclasses.dataclass
class ShapedProposal:
    drafts: np.ndarray  # [L] int64: what the acceptance rule sees
    probs: np.ndarray | None  # [L, V] when sampled, else None
    verify_ids: np.ndarray  # [L'] int64, L' = L or L - 1 (a refused sampled draft is not verified)
    kept: int  # the proposer's own tokens still in `drafts`, refused one included
    forced: int  # forced tokens appended after them


def shape_proposal(constraint: Constraint, drafts: np.ndarray, probs: np.ndarray | None,
                   forced_limit: int) -> ShapedProposal:
    """drafts [k] int64, probs [k, V] or None -> the proposal to verify (see the module docstring)."""
    ids = drafts.tolist()
    valid = constraint.valid_prefix(ids)
    if valid < len(ids):
        if probs is None:  # point mass: a refused token would be rejected and q drawn from; cut before it
            verify, kept, forced = _with_forced(constraint, drafts[:valid], forced_limit)
            return ShapedProposal(verify, None, verify, kept, forced)
        return ShapedProposal(drafts[:valid + 1], probs[:valid + 1], drafts[:valid], valid + 1, 0)
    verify, kept, forced = _with_forced(constraint, drafts, forced_limit)
    if forced and probs is not None:  # forced rows: probability 1 on the forced token
        extra = np.zeros((forced, probs.shape[1]), dtype=probs.dtype)
        extra[np.arange(forced), verify[kept:]] = 1.0
        probs = np.concatenate([probs, extra])
    return ShapedProposal(verify, probs, verify, kept, forced)


def _with_forced(constraint: Constraint, drafts: np.ndarray, limit: int) -> tuple[np.ndarray, int, int]:
    kept = drafts.size
    if limit - kept <= 0:
        return drafts, kept, 0
    ids = drafts.tolist()
    constraint.consume(ids)
    forced = constraint.forced(limit - kept)
    constraint.rollback(len(ids))
    if not forced:
        return drafts, kept, 0
    return np.concatenate([drafts, np.asarray(forced, dtype=np.int64)]), kept, len(forced)


def masked_logits(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """logits [R, V], allowed [R, V'] bool (V' = the constraint's vocabulary) -> logits [R, V], -inf where
    refused."""
    v = min(logits.shape[1], allowed.shape[1])
    out = np.full_like(logits, -np.inf)
    np.copyto(out[:, :v], logits[:, :v], where=allowed[:, :v])
    return out
