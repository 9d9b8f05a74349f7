"""`FamilyChooser`: which family of passes a batched step runs, and its k plan's calibration.

Two families (DESIGN.md's glossary): **fused** (on the target's own session: a pass of its own per speculating
request, plus the batched one-token pass in a *batched* plan, or one pass per request in a *separate* plan) and
**packed** (one pass of the packed or ragged graph over every request's rows; the prompt chunks ride along).
Each step the chooser compares their predicted goodput (goodput.py), each scaled by its **calibration**: realized /
predicted goodput of that family's past steps (the cost tables are measured on short contexts without prefill work,
and acceptance estimates err), kept apart for steps that drafted (`spec_calibration`): a drafting plan runs only
while it beats the same family's plain plan as realized (`plan`). Switching families between two ONNX Runtime
sessions costs a pass's worth of contention (the idle session's pool threads still spin: 20 switches in 128 steps
gave 0.83-0.88x plain batching on SmolLM2 fp32 at 8 clients), so unless both sessions share one thread pool
(`switch_free`) the switch is rationed: hysteresis (SWITCH_MARGIN to move to packed, LEAVE_MARGIN back) on a
smoothed ratio, and MIN_FAMILY_STEPS in a family before the next switch.
"""

from __future__ import annotations

from specrt.runtime.batch.goodput import CostTable, KPlan, plan_packed, plan_step

FUSED, PACKED = "fused", "packed"
SWITCH_MARGIN = 1.15  # predicted goodput the packed family must offer before the scheduler moves to it
LEAVE_MARGIN = 1.05  # ... and the fused family, to move back
RATIO_DECAY = 0.8  # smoothing of the predicted packed / fused goodput ratio over steps
MIN_FAMILY_STEPS = 8  # steps in a family before the scheduler may switch again
CALIBRATION_DECAY = 0.9  # smoothing of each family's realized / predicted goodput
CALIBRATION_RELAX = 0.02  # per plain step: how far a family's drafting calibration moves back to its plain one


class FamilyChooser:
    def __init__(self, costs: CostTable, packed: bool, batched_decode: bool, switch_free: bool) -> None:
        """`packed`: the packed family exists (a pool with packed passes, max_batch > 1); `batched_decode`: the
        fused family has the one-token batched pass (else the packed family is taken whenever it can run);
        `switch_free`: both families' passes share one thread pool (a switch costs nothing)."""
        self.costs, self.packed, self.batched_decode, self.switch_free = costs, packed, batched_decode, switch_free
        self.family = FUSED  # the family of the last step
        self.family_steps = 0  # steps since the family last changed
        self.packed_ratio = 1.0  # smoothed predicted goodput of the packed family over the fused one
        self.calibration = {FUSED: 1.0, PACKED: 1.0}  # per family: realized / predicted goodput (smoothed)
        self.spec_calibration = {FUSED: 1.0, PACKED: 1.0}  # ... of its steps that drafted

    def choose(self, acceptance: list[float], max_ks: list[int], draft_costs: list[float],
               prefilling: bool, gains: dict | None = None) -> tuple[str, KPlan | None]:
        """The family of this step's decode (`acceptance`, `max_ks`, `draft_costs`: per decoding request) and, when
        it planned it to compare, that family's k plan. Packed is possible with two requests or more decoding, or
        one with prompts to prefill (their chunks ride in the pass, and a closed-loop client's next request does not
        switch sessions twice); a fused family without the batched pass always takes it then. `gains`: per family,
        the tree proposers' expected accepted drafts per count (goodput.py; trees.py), or None."""
        decoding = len(acceptance)
        if not (self.packed and self.costs.packed and decoding and decoding + bool(prefilling) >= 2):
            self.family, self.family_steps = FUSED, 0
            return FUSED, None
        if not self.batched_decode:
            self.family = PACKED
            return PACKED, None
        packed_plan = plan_packed(acceptance, max_ks, draft_costs, self.costs, _of(gains, PACKED))
        fused_plan = plan_step(acceptance, max_ks, draft_costs, self.costs, True, _of(gains, FUSED))
        g_packed, g_fused = packed_plan.goodput, fused_plan.goodput
        # the ratio smoothed over steps (one step's n-gram matches say little) and a minimum stay per family
        ratio = g_packed * self.calibration[PACKED] / max(g_fused * self.calibration[FUSED], 1e-9)
        self.packed_ratio = RATIO_DECAY * self.packed_ratio + (1 - RATIO_DECAY) * ratio
        self.family_steps += 1
        use = self.family == PACKED
        if self.switch_free:  # both sessions on one thread pool: a switch costs nothing, each step its best
            use = ratio > 1.0
        elif self.family_steps >= MIN_FAMILY_STEPS:
            if use:  # leave for a smaller margin: staying in the worse family costs every step (and the packed
                use = self.packed_ratio * LEAVE_MARGIN >= 1.0  # predictions carry the less certain estimates)
            else:
                use = self.packed_ratio >= SWITCH_MARGIN
        if use != (self.family == PACKED):
            self.family, self.family_steps = (PACKED if use else FUSED), 0
        return self.family, packed_plan if use else fused_plan

    def plan(self, family: str, acceptance: list[float], max_ks: list[int], draft_costs: list[float],
             planned: KPlan | None = None, gains: dict | None = None) -> KPlan:
        """The k plan in `family` (`planned`: the one `choose` made), or that family's plain plan (every k 0) when
        the drafting plan's prediction, scaled by the calibration of this family's drafting steps, falls below the
        plain plan's scaled by that of its plain steps: a batch where drafting disappoints stops drafting (SmolLM2
        fp32, 4-8 clients: 0.90-0.93x plain batching before) and drafts again once the calibration has drifted back
        (CALIBRATION_RELAX per plain step)."""
        plan = planned or self._plan(family, acceptance, max_ks, draft_costs, gains)
        if not any(plan.ks):
            return plan
        plain = self._plan(family, acceptance, [0] * len(plan.ks), draft_costs, gains)
        if plan.goodput * self.spec_calibration[family] >= plain.goodput * self.calibration[family]:
            return plan
        return plain

    def _plan(self, family: str, acceptance: list[float], max_ks: list[int], draft_costs: list[float],
              gains: dict | None = None) -> KPlan:
        if family == PACKED:
            return plan_packed(acceptance, max_ks, draft_costs, self.costs, _of(gains, PACKED))
        return plan_step(acceptance, max_ks, draft_costs, self.costs, self.batched_decode, _of(gains, FUSED))

    def calibrate(self, realized: float, predicted: float, drafted: bool) -> None:
        """Fold a step's realized / predicted goodput into the calibration of the family in use: the drafting one
        when the step drafted, else the plain one, and then the drafting one drifts CALIBRATION_RELAX of the way
        back to the plain one (not tried lately: drafting is retried once the drift has undone a disappointment);
        the other family's two calibrations drift the same way toward this family's (unknown lately, the other
        family is assumed to err as this one does: one early disappointment, steps with prefill work riding
        along, does not keep it off for the rest of a run)."""
        table = self.spec_calibration if drafted else self.calibration
        table[self.family] = CALIBRATION_DECAY * table[self.family] + (1 - CALIBRATION_DECAY) * realized / predicted
        if not drafted:
            plain, spec = self.calibration[self.family], self.spec_calibration[self.family]
            self.spec_calibration[self.family] = spec + CALIBRATION_RELAX * (plain - spec)
        other = PACKED if self.family == FUSED else FUSED
        for t in (self.calibration, self.spec_calibration):
            t[other] += CALIBRATION_RELAX * (t[self.family] - t[other])


def _of(gains: dict | None, family: str) -> list | None:
    return gains.get(family) if gains else None
