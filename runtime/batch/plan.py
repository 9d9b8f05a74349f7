"""A batched step's plan: what the scheduler decides before a pass runs (`StepPlan`), and the passes that carry it out.

`prepare` reads the decoding requests (the most each may draft, the free n-gram proposals, the drafting costs); the
family chooser (family.py) picks the family and the k plan (goodput.py); `request_ks` applies the per-request rules
(probes, seeded requests' own k); the scheduler then makes the proposals and lays out the passes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specrt.runtime.batch import trees as tree_offers
from specrt.runtime.batch.failures import guarded
from specrt.runtime.batch.family import FUSED, PACKED
from specrt.runtime.batch.goodput import CostTable
from specrt.runtime.batch.sequence import DRAFT_KIND, BatchSequence
from specrt.runtime.proposers.base import Proposal
from specrt.runtime.step import no_drafts, tree_or_chain

PROBE_AFTER = 8  # steps without drafting after which a draft-model request decoding alone drafts one token


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Per decoding request (in `running` order), what the plan reads."""

    seqs: list[BatchSequence]
    max_ks: list[int]  # the most it may draft this step (0: it cannot)
    free: list[Proposal | None]  # its free proposal (n-gram, hybrid's n-gram branch when it matched), a chain
    draft_costs: list[float]  # seconds per drafted token (0 for a free proposal)
    offers: list = dataclasses.field(default_factory=list)  # per request its TreeOffer (trees.py) or None
    trees: bool = False  # the fused family's own passes verify trees

    @property
    def acceptance(self) -> list[float]:
        return [s.acceptance for s in self.seqs]

    @property
    def gains(self) -> dict | None:
        """Per family, the tree proposers' expected accepted drafts per count (a tree on the fused family's own
        passes where they verify trees, else the best chain), None where no request offers a tree."""
        if not any(o is not None for o in self.offers):
            return None
        return {FUSED: [o.gains(not self.trees) if o is not None else None for o in self.offers],
                PACKED: [o.gains(True) if o is not None else None for o in self.offers]}

    @property
    def seeded_trees(self) -> bool:
        """A seeded request of a tree method decodes: the step stays fused (its tree as alone, trees.py)."""
        return self.trees and any(s.policy is not None and s.method in tree_offers.TREE_METHODS for s in self.seqs)


@dataclasses.dataclass(frozen=True)
class Decode:
    """One decoding request's part of the step."""

    seq: BatchSequence
    k: int  # drafts planned (0: none)
    proposal: Proposal  # what its pass verifies: k drafts (a chain; a tree in an own pass), or none
    free: Proposal | None  # a free proposal not used (k = 0): its first draft is judged against the token picked


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A prompt chunk of a request in prefill."""

    seq: BatchSequence
    ids: np.ndarray  # [S] int64


@dataclasses.dataclass(frozen=True)
class OwnPass:
    """A request's pending token and drafts in its own region, on the target's own session (fused family)."""

    decode: Decode


@dataclasses.dataclass(frozen=True)
class BatchedTokenPass:
    """One batched one-token pass over every decoding request (fused family, batched plan): each one that did not
    draft gets its token; one that did gets a token more."""

    decodes: list[Decode]


@dataclasses.dataclass(frozen=True)
class PackedRowsPass:
    """ONE pass of the packed (or ragged) graph: every decoding request's pending token and drafts, and the prompt
    chunks of the requests in prefill, each call's rows exactly its call alone (packed family)."""

    decodes: list[Decode]
    chunks: list[Chunk]


@dataclasses.dataclass(frozen=True)
class PrefillPass:
    """A prompt chunk on the target's own session (fused family: before the decode)."""

    chunk: Chunk


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """What a step decides: the family, the passes in order (each committed before the next runs: the batched pass
    reads the pending tokens the own passes left), and the goodput predicted for the decode (0: none planned)."""

    family: str  # family.FUSED | family.PACKED
    passes: list
    goodput: float = 0.0
    drafted: bool = False  # some request drafts
    then_decode: bool = False  # prompt chunks on the target's own session: the decode is planned once they ran
    decoding: bool = False  # the plan decodes (a step, for the goodput counters)
    planning_s: float = 0.0  # seconds spent planning (proposals included)


def prepare(seqs: list[BatchSequence], costs: CostTable, capacity: int, trees: bool = False) -> Prepared:
    """The plan's inputs. Free proposals (n-gram, hybrid's n-gram branch when it matches) cost nothing: they are made
    first, so that k is capped by what matched, and acceptance is estimated per kind of proposal (n-gram: its match
    size; a draft model's: DRAFT_KIND, so that hybrid's n-gram judgements do not price its draft model, nor the
    reverse). A seeded request's k is its policy's, asked once per step (`forced_k`: prepare may run twice)."""
    max_ks = [0 if s.proposer is None or s.error is not None
              else max(0, min(s.max_k, s.remaining - 1, capacity - s.n - 1)) for s in seqs]
    for i, s in enumerate(seqs):
        if s.policy is not None:
            if s.forced_k is None:
                s.forced_k = max(0, min(s.policy.next_k(), max_ks[i]))
            max_ks[i] = s.forced_k
    free = []
    for i, (s, mk) in enumerate(zip(seqs, max_ks)):
        propose = getattr(s.proposer, "free_propose", None) if mk > 0 else None
        f = guarded(s, propose, s.tokens, s.n, mk) if propose is not None else None
        f = f.chain() if f is not None else None  # batched passes verify chains
        s.kind = s.proposer.matched if f is not None else (DRAFT_KIND if s.draft is not None else None)
        if f is not None:
            max_ks[i] = f.token_ids.size
        free.append(f)
    if len(seqs) > 1:  # with others in the batch, a draft model that sat out many tokens is not restarted when its
        # catch-up (a prefill of those tokens, the whole prompt on its first draft) would cost more than a batched
        # pass (priced at the one-token draft cost: an upper bound), since it holds every request
        limit = costs.t_batch(len(seqs))
        max_ks = [0 if f is None and s.draft is not None and s.policy is None
                  and (s.n - 1 - s.draft.length) * costs.draft_token > limit else mk
                  for s, mk, f in zip(seqs, max_ks, free)]
    dcost = [costs.draft_token if s.draft is not None and f is None else 0.0 for s, f in zip(seqs, free)]
    offers = []  # tree proposers (auto, recycle; not seeded: those keep their own sizing) offer scored candidates
    for i, s in enumerate(seqs):
        o = None
        if max_ks[i] > 0 and s.policy is None and free[i] is None:
            cap = max_ks[i] if not trees else min(max_ks[i], max(s.target.tree_max_rows - 1, 1))
            o = guarded(s, tree_offers.offer, s.proposer, s.tokens, s.n, cap)
            if o is not None:
                max_ks[i] = len(o.order)
        offers.append(o)
    return Prepared(list(seqs), max_ks, free, dcost, offers, trees)


def request_ks(prepared: Prepared, ks: list[int], packed: bool) -> list[int]:
    """The plan's ks with the per-request rules applied.

    Probes: a request whose drafts cost something (a draft model) is judged only when it drafts: planned at k = 0
    from a low estimate it would never draft again. One that has not drafted for PROBE_AFTER steps drafts one token
    when it decodes alone (not packed) only: there a draft saves a whole pass, while with other requests in the batch
    a probe's catch-up cost more than it found (SmolLM2 fp32 + int4 draft, 2 clients: 0.85x plain batching probing,
    0.90x not). n-gram drafts are judged every step for free.
    Seeded requests: k is the policy's (capped by what the free proposal matched: `prepare`), so the step draws the
    random numbers of the same step alone."""
    ks = list(ks)
    alone = len(prepared.seqs) == 1 and not packed  # one request decoding: the single-sequence loop
    for i, (s, mk, f) in enumerate(zip(prepared.seqs, prepared.max_ks, prepared.free)):
        if s.draft is None or f is not None:
            continue
        if ks[i] == 0 and s.idle + 1 >= PROBE_AFTER and mk > 0 and alone:
            ks[i] = 1
        s.idle = 0 if ks[i] > 0 else s.idle + 1
    return [mk if s.policy is not None else k for s, k, mk in zip(prepared.seqs, ks, prepared.max_ks)]


def first(prop: Proposal, k: int) -> Proposal:
    """The first k tokens of a point-mass proposal (a free proposal made for the largest k)."""
    if prop.token_ids.size <= k:
        return prop
    return dataclasses.replace(prop, token_ids=prop.token_ids[:k])


def decode(s: BatchSequence, k: int, free: Proposal | None, offer, chain_only: bool) -> Decode:
    """The request's part of the plan: its proposal for k drafts (the free one cut to k, the k nodes of its tree
    offer, else its proposer's). Trees only where not `chain_only` (own passes of the fused family on a target with
    trees: trees.py) and from the tree methods; else chains."""
    prop = guarded(s, _proposal, s, k, free, offer, chain_only) if k else None
    if prop is None:  # k = 0, or its proposer raised: the request failed (failures.py) and leaves at retirement
        return Decode(s, 0, no_drafts(s.tokens), free)
    s.stats.draft_calls += prop.calls
    return Decode(s, k, prop, free)


def _proposal(s: BatchSequence, k: int, free: Proposal | None, offer, chain_only: bool) -> Proposal:
    chain = chain_only or s.method not in tree_offers.TREE_METHODS
    if free is not None:
        prop = first(free, k)
    elif offer is not None:
        prop = tree_offers.proposal(s.proposer, offer, k, chain)
    else:
        prop = s.proposer.propose(s.tokens, s.n, k)
    ids, vocab = prop.token_ids, getattr(s.target, "vocab_size", None)
    if ids.size and vocab is not None and not (0 <= int(ids.min()) and int(ids.max()) < vocab):
        # a packed pass over every request would fail on it: this request fails alone (a bug, not the client's: 500)
        raise RuntimeError(f"the {s.method} proposer drafted token ids outside the vocabulary [0, {vocab}): "
                              f"{ids.tolist()}")
    return tree_or_chain(prop, k, s.target, chain)
