"""One request inside the scheduler: its committed tokens, KV regions (target, draft), proposer, random
generator, acceptance estimate, stats, and the events it has produced."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

import numpy as np

from specrt.runtime.request import GenerationRequest
from specrt.runtime.stats import GenerationStats

PRIOR_ACCEPTANCE = 0.5  # per-token acceptance assumed before a request has drafted (weight PRIOR_WEIGHT drafts)
PRIOR_WEIGHT = 2.0
DECAY = 0.9  # per step: recent acceptance counts more
DRAFT_KIND = "draft"  # the kind of a draft model's proposals (an n-gram proposal's kind is its match size)


@dataclasses.dataclass(eq=False)
class BatchSequence:
    request_id: int
    prompt_ids: np.ndarray  # [N] int64
    request: GenerationRequest  # resolved (sampling defaults filled, checked against the bundle)
    method: str
    max_k: int
    emit: Callable[[list[int], "BatchSequence"], None]  # called with each step's new tokens (the scheduler's thread)
    stats: GenerationStats
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    tokens: np.ndarray | None = None  # [capacity] committed sequence; tokens[:n]
    n: int = 0
    prefilled: int = 0  # prompt tokens fed to the target so far
    target: Any = None  # the target region's runner
    draft: Any = None  # the draft region's runner (draft / hybrid)
    proposer: Any = None
    rng: np.random.Generator | None = None
    accepted: float = PRIOR_ACCEPTANCE * PRIOR_WEIGHT  # decayed counts of accepted / offered drafts
    offered: float = PRIOR_WEIGHT
    # the same counts per kind of proposal (an n-gram proposal's matched suffix size): a 3-token match is accepted
    # far more often than a 1-token one, and the plan drafts more where it pays. `kind`: this step's proposal
    by_kind: dict = dataclasses.field(default_factory=dict)
    kind: Any = None
    idle: int = 0  # decode steps since it last drafted (draft-model requests: `plan.request_ks`)
    # seeded sampling: the Generator's k policy for the request (its k schedule a function of its own acceptance
    # counts, never of timings or of the rest of the batch: the same seed gives the same text as alone), and the k
    # it chose for the current step (None between steps)
    policy: Any = None
    forced_k: int | None = None
    finished: str = ""  # finish reason once done
    error: BaseException | None = None  # what ended it, raised in its part of a step (failures.py)
    # one prefill per prompt (shared_prompt.py): the sequence whose prefill it waits for, those waiting for its own,
    # its last prompt row's logits [V] once prefilled, and the donor's when its rows were copied (until it completes)
    donor: Any = None
    followers: list = dataclasses.field(default_factory=list)
    prompt_last: np.ndarray | None = None
    shared_last: np.ndarray | None = None
    # prefix caching (prefix_cache.py): prompt rows copied from the store, and how many prompt rows are exact to keep
    # (None: all; a one-row chunk inside the prompt or a donor's rows stop them)
    cached_tokens: int = 0
    exact_rows: int | None = None
    started: float = 0.0  # time.perf_counter() at submission
    stop_ids: frozenset = frozenset()  # the tokens that end it: the model's EOS ids and its stop_token_ids (request)

    @property
    def acceptance(self) -> float:
        """Per-token acceptance estimate for this step's kind of proposal (decayed accepted drafts over decayed
        drafts judged); a kind not judged yet: `_kind_start`."""
        acc, off = self.by_kind.get(self.kind) or self._kind_start()
        return acc / off if off > 0 else PRIOR_ACCEPTANCE

    def _kind_start(self) -> tuple[float, float]:
        """The counts (weight PRIOR_WEIGHT) a kind not judged yet starts from: the request's overall rate, or the
        prior for a draft model's proposals (DRAFT_KIND: hybrid's overall counts are mostly n-gram judgements, made
        every step for free, and say little about its draft model). Kind None: the overall counts themselves."""
        if self.kind is None:
            return self.accepted, self.offered
        rate = PRIOR_ACCEPTANCE
        if self.kind != DRAFT_KIND and self.offered > 0:
            rate = self.accepted / self.offered
        return rate * PRIOR_WEIGHT, PRIOR_WEIGHT

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        """A step that offered `drafted` drafts (of this step's kind) and kept `accepted`: a rejection ends the run,
        so the drafts judged are accepted + (1 if one was rejected)."""
        judged = accepted + (1 if accepted < drafted else 0)
        if self.kind is not None:
            acc, off = self.by_kind.get(self.kind) or self._kind_start()
            self.by_kind[self.kind] = (DECAY * acc + accepted, DECAY * off + judged)
        self.accepted = DECAY * self.accepted + accepted
        self.offered = DECAY * self.offered + judged

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - self.stats.new_tokens
