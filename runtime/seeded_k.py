"""Adaptive k for seeded sampling: the same seed gives the same text, in every run and process.

Which random numbers a step draws depends on its k, so a k schedule driven by measured timings (noise)
makes seeded sampling irreproducible. When a seed is given, the Generator uses `CountOnlyAdaptiveK`:
the same controller as `AdaptiveK`, fed a fixed cost model instead of the clock, and started fresh for
every call. Its k schedule is then a function of acceptance counts only (which the seed fixes).

Cost model (in units of one plain target step): one verify pass over k + 1 tokens costs
`1 + verify_slope * k`; one draft token costs `draft_cost` (the draft/target parameter ratio for a draft
model, small constants for Medusa heads and n-gram look-ups).
"""

from __future__ import annotations

from .policy import AdaptiveK

VERIFY_SLOPE = 0.05  # extra verify cost per drafted token (CPU, small k: measured 0.03-0.08)
MEDUSA_DRAFT_COST = 0.02  # heads on one hidden state, per drafted token
NGRAM_DRAFT_COST = 0.001  # hash look-ups


class CountOnlyAdaptiveK(AdaptiveK):
    """`AdaptiveK` whose cost estimates come from a fixed model, never from timings."""

    def __init__(self, max_k: int, draft_cost: float, verify_slope: float = VERIFY_SLOPE, **kwargs) -> None:
        super().__init__(max_k, **kwargs)
        self.model_draft_cost = float(draft_cost)
        self.verify_slope = float(verify_slope)

    def update(self, k: int, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        super().update(k, drafted, accepted, self.model_draft_cost * drafted, 1.0 + self.verify_slope * drafted)


def model_draft_cost(method: str, manifest) -> float:
    """The fixed per-token draft cost for `method`, relative to one target step."""
    if method == "draft":
        models = manifest.models
        target = float(models["target"].get("num_parameters") or 0)
        draft = float(models["draft"].get("num_parameters") or 0)
        return draft / target if target > 0 and draft > 0 else 0.1
    if method == "medusa":
        return MEDUSA_DRAFT_COST
    return NGRAM_DRAFT_COST
