"""The proposer protocol: every drafting method is one file implementing these three methods.

    start(tokens, n, target_hidden)     a new request; tokens[:n] is the prompt (+ first generated token)
    propose(tokens, n, k) -> Proposal   up to k draft tokens continuing tokens[:n]
    observe(n, num_accepted, target_hidden)
                                        after verification: tokens[:n] is now committed; num_accepted of
                                        the last proposal's tokens were kept (methods with nothing to learn
                                        or roll back implement it as a no-op)

`tokens` is the loop's preallocated int64 array; proposers read it, never write it. `target_hidden`
([S, hidden] or None) is the target's final hidden state of the pass just made (the prefill's last chunk,
or the verify pass), handed over by the loop for proposers that read it (Medusa heads).

A `Proposal` states its kind: a **point mass** (n-gram, Medusa top-1, a greedy draft: the acceptance rule
treats p(d_i) = 1) or **sampled** (a draft model sampling from warped distributions `probs`, which the
rejection sampler needs for min(1, q/p) and the residual norm(max(q - p, 0))).

A proposal may be a **token tree** (docs/trees.md): `parents [k']` int64, `parents[i]` the index of draft i's
parent in `token_ids` or -1 for the root (the pending last committed token), topological (`parents[i] < i`);
None is a chain. `k` bounds the node count. The loop verifies the whole tree in one target pass where the runner
supports trees (else the path of first children), and after every verify pass calls
`proposer.observe_verify(fed_ids [S], logits [S, V], parents [S-1] or None)` when the proposer defines it: the
pending token + the verified drafts in node order and the target's raw rows for them (a view valid until the next
target call; with a screened greedy LM head, exact only at its candidates), which Token Recycling learns from. It may
return the rows' argmax as a `recycle_table.RowArgmax` (exactly NumPy's argmax of the raw rows; the loop's greedy rule
then reuses it instead of reading the rows again); any other return value is ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np


POINT_MASS = "point_mass"
SAMPLED = "sampled"


class CallClock:
    """EMA of a model proposer's ordinary call (one row, or the one or two rows after a drafting step), for
    `Proposal.catch_up_s`: a first call that fed the rows of steps the proposer sat out costs that much more."""

    def __init__(self) -> None:
        self.seconds: float | None = None

    def ordinary(self, seconds: float) -> None:
        self.seconds = seconds if self.seconds is None else 0.75 * self.seconds + 0.25 * seconds

    def beyond(self, seconds: float) -> float:
        """A catch-up call's time beyond an ordinary call (0 until one was timed)."""
        return 0.0 if self.seconds is None else max(seconds - self.seconds, 0.0)


@dataclasses.dataclass(frozen=True)
class Proposal:
    token_ids: np.ndarray  # [k'] int64, k' <= k (may be empty)
    kind: str = POINT_MASS  # POINT_MASS or SAMPLED
    probs: np.ndarray | None = None  # [k', V] draft distributions when SAMPLED, else None
    calls: int = 0  # model forward passes spent drafting
    source: str = ""  # the branch that drafted it, for proposers with several (hybrid: "ngram" | "draft")
    # seconds spent feeding the draft model committed tokens beyond its usual one or two (after steps it did not
    # draft: speculation off, n-gram branch): a one-off cost that the adaptive policy keeps out of its
    # per-token draft cost (it stays in the timings and stats)
    catch_up_s: float = 0.0
    parents: np.ndarray | None = None  # [k'] int64 tree parents (runtime/tree.py), None: a chain

    def __post_init__(self) -> None:
        if self.parents is not None:
            from specrt.runtime.tree import check_parents

            check_parents(self.parents, self.token_ids.size)
        if self.kind == SAMPLED:
            if self.probs is None or self.probs.shape[0] != self.token_ids.size:
                raise ValueError("a sampled proposal needs probs [k', V] with one row per draft token")
        elif self.kind == POINT_MASS:
            if self.probs is not None:
                raise ValueError("a point-mass proposal carries no probabilities")
        else:
            raise ValueError(f"proposal kind must be {POINT_MASS!r} or {SAMPLED!r}, got {self.kind!r}")

    def chain(self) -> "Proposal":
        """This proposal as a chain: a tree's path of first children (runtime/tree.py), with its probs rows."""
        if self.parents is None:
            return self
        from specrt.runtime.tree import first_chain

        idx = first_chain(self.parents)
        return dataclasses.replace(self, token_ids=self.token_ids[idx], parents=None,
                                   probs=self.probs[idx] if self.probs is not None else None)

    @classmethod
    def point_mass(cls, token_ids: np.ndarray, calls: int = 0, catch_up_s: float = 0.0,
                   parents: np.ndarray | None = None) -> "Proposal":
        return cls(token_ids, POINT_MASS, None, calls, catch_up_s=catch_up_s, parents=parents)

    @classmethod
    def sampled(cls, token_ids: np.ndarray, probs: np.ndarray, calls: int = 0,
                catch_up_s: float = 0.0) -> "Proposal":
        return cls(token_ids, SAMPLED, probs, calls, catch_up_s=catch_up_s)


class Proposer(Protocol):
    name: str

    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None: ...

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal: ...

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None: ...
