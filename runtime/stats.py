"""Per-call statistics. Conventions (as vLLM states them):

* acceptance_rate = accepted_tokens / drafted_tokens (0 when nothing was drafted)
* mean_accepted_tokens = 1 + accepted_tokens / verify_steps: tokens emitted per target pass after the
  prefill, counting the bonus or recovered token (1.0 for plain decoding)
* accepted_histogram[j] = number of verify steps that accepted exactly j drafts
* num_speculative_tokens = the k used at the last step (0 when speculation was off)
* constraint = the output constraint ("json_schema: ...", "regex: ...", "" when unconstrained); forced_tokens =
  tokens the constraint forced and the loop verified as drafts (counted in drafted_tokens too), forced_accepted
  = how many of them were accepted
* branches[name] = {"steps", "drafted", "accepted"} per drafting branch, for proposers that name one per
  proposal (hybrid: "ngram" / "draft"); empty for single-branch methods
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class GenerationStats:
    method: str = "none"
    backend: str = ""
    num_speculative_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV rows came from the prefix cache (runtime/batch/prefix_cache.py)
    new_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    tree_passes: int = 0  # verify passes that carried a token tree (not a chain: docs/trees.md)
    accepted_histogram: list[int] = dataclasses.field(default_factory=list)
    k_history: list[int] = dataclasses.field(default_factory=list)
    branches: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    target_calls: int = 0
    draft_calls: int = 0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    elapsed_s: float = 0.0
    finish_reason: str = ""
    # with request.logprobs: a TokenLogprob per emitted token (runtime/logits_processors.py); not in to_dict
    token_logprobs: list = dataclasses.field(default_factory=list, repr=False, compare=False)
    provider: str = ""
    speculation_note: str = ""  # why speculation is off (adaptive k settled on 0), else ""
    constraint: str = ""
    forced_tokens: int = 0
    forced_accepted: int = 0
    context_limited: bool = False  # prompt + max_new_tokens exceeded max_seq_len: output stops at the context

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        return 1.0 + self.accepted_tokens / self.verify_steps if self.verify_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens after the first one per second of decoding (prefill excluded)."""
        decode_s = self.elapsed_s - self.prefill_seconds
        return (self.new_tokens - 1) / decode_s if decode_s > 0 and self.new_tokens > 1 else 0.0

    def record_step(self, k: int, drafted: int, accepted: int, source: str = "") -> None:
        self.verify_steps += 1
        if source:
            b = self.branches.setdefault(source, {"steps": 0, "drafted": 0, "accepted": 0})
            b["steps"] += 1
            b["drafted"] += drafted
            b["accepted"] += accepted
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self.k_history.append(k)
        self.num_speculative_tokens = k
        if len(self.accepted_histogram) <= accepted:
            self.accepted_histogram.extend([0] * (accepted + 1 - len(self.accepted_histogram)))
        self.accepted_histogram[accepted] += 1

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(dataclasses.replace(self, token_logprobs=[]))
        d.pop("token_logprobs")
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_tokens=self.mean_accepted_tokens,
                 tokens_per_second=self.tokens_per_second, decode_tokens_per_second=self.decode_tokens_per_second)
        return d
