"""Speculation-length policies (`KPolicy`): how many tokens to draft at the next step.

    next_k() -> int          the k to try next (0 = a plain decoding step)
    current_k -> int         the k it currently settles on (reported as num_speculative_tokens)
    update(k, drafted, accepted, draft_s, verify_s)   what the step measured

`FixedK` always answers the same k. `AdaptiveK` picks the k that maximises predicted tokens per second
(Leviathan et al. 2023, Theorem 3.8) from measured acceptance and costs:

    a = per-token acceptance probability, c = seconds per draft token,
    V(k) = seconds of a verify pass over k + 1 tokens (V(0) = a plain decode step)
    expected tokens per step  E(k) = (1 - a^(k+1)) / (1 - a)
    tokens per second         R(k) = E(k) / (k * c + V(k))

Estimates are exponential moving averages over steps: `a` from accepted / (accepted + rejections)
(a step that stops at a rejection counts one rejection), `c` from draft time per draft token, and V(k)
per k, with a least-squares line through the measured k for unmeasured ones. AdaptiveK starts
with one plain step (to measure V(0)) and one step at `initial_k`, then picks argmax_k R(k); every
`explore_every` steps it tries a neighbour (k + 1, then k - 1) so stale cost estimates get refreshed. It turns
speculation off (k = 0) when no k beats plain decoding by `margin`, and while off it probes with a
small k every `probe_every` steps (again at once after a fully accepted probe), so an easier stretch
later in the text is noticed. The Generator keeps one AdaptiveK per method across calls, so measured
costs and acceptance carry over from one request to the next.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class KPolicy(Protocol):
    """What the loop asks of a speculation-length policy."""

    def next_k(self) -> int: ...

    @property
    def current_k(self) -> int: ...

    def update(self, k: int, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None: ...


class FixedK:
    """Always the same k (nothing to learn: `update` is a no-op)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self) -> int:
        return self.k

    @property
    def current_k(self) -> int:
        return self.k

    def update(self, k: int, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass


class AdaptiveK:
    def __init__(self, max_k: int, initial_k: int = 4, alpha: float = 0.25, margin: float = 1.05,
                 probe_every: int = 12, probe_k: int = 2, prior_acceptance: float = 0.6,
                 explore_every: int = 6) -> None:
        self.max_k = max_k
        self.initial_k = min(initial_k, max_k)
        self.alpha = alpha
        self.margin = margin
        self.probe_every = probe_every
        self.probe_k = min(probe_k, max_k)
        self.verify_cost: list[float | None] = [None] * (max_k + 1)  # EMA seconds per verify, by k
        self.draft_cost: float | None = None  # EMA seconds per draft token
        self.acc_num, self.acc_den = prior_acceptance, 1.0  # EMA of accepted and of accepted + rejections
        self.steps = 0
        self.off_steps = 0
        self.last_probe_full = False
        self.explore_every = explore_every
        self.explorations = 0
        self._best: int | None = None  # best_k() for the current estimates

    # -------------------------------------------------------------------------------- estimates
    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.alpha) * old + self.alpha * new

    @property
    def acceptance(self) -> float:
        return min(max(self.acc_num / self.acc_den, 0.0), 0.999) if self.acc_den > 0 else 0.0

    def verify_estimate(self) -> list[float]:
        """V(k) for k = 0..max_k: measured where available, else a least-squares line."""
        ks = [k for k, v in enumerate(self.verify_cost) if v is not None]
        vs = [self.verify_cost[k] for k in ks]
        slope, intercept = 0.0, (vs[0] if vs else 1.0)
        if len(ks) >= 2:
            mx, my = sum(ks) / len(ks), sum(vs) / len(vs)
            sxx = sum((x - mx) ** 2 for x in ks)
            slope = max(sum((x - mx) * (y - my) for x, y in zip(ks, vs)) / sxx, 0.0)
            intercept = my - slope * mx
        # Verifying more tokens never costs less: keep V non-decreasing, so timing noise on one k
        # cannot make speculation look cheaper than plain decoding.
        out, running = [], 1e-9
        for k, v in enumerate(self.verify_cost):
            running = max(running, v if v is not None else intercept + slope * k)
            out.append(running)
        return out

    def predicted_rates(self) -> list[float]:
        """R(k) for k = 0..max_k, tokens per second."""
        a, c = self.acceptance, self.draft_cost or 0.0
        return [(1 - a ** (k + 1)) / (1 - a) / (k * c + v) for k, v in enumerate(self.verify_estimate())]

    @property
    def current_k(self) -> int:
        """The k the controller currently believes best (probes and explorations excluded)."""
        return self.best_k() if self.steps >= 2 else self.initial_k

    def best_k(self) -> int:
        """argmax_k R(k), or 0 when no k beats plain decoding by `margin`. Computed once per change of the
        estimates (the loop asks several times per step; each step changes them once)."""
        if self._best is None:
            rates = self.predicted_rates()
            k = max(range(len(rates)), key=rates.__getitem__)
            self._best = 0 if k > 0 and rates[k] < self.margin * rates[0] else k
        return self._best

    def prime(self, verify_costs, draft_cost: float | None) -> None:
        """Start from costs measured at load (V(k) per k, seconds per draft token) instead of a plain step
        and a step at `initial_k`: a short run then begins at the k those costs and the prior acceptance
        predict best."""
        for k, v in enumerate(list(verify_costs)[: self.max_k + 1]):
            if v is not None and v > 0 and self.verify_cost[k] is None:
                self.verify_cost[k] = float(v)
        if draft_cost is not None and self.draft_cost is None:
            self.draft_cost = float(draft_cost)
        self._best = None
        self.steps = max(self.steps, 2)

    def off_reason(self) -> str:
        """Why speculation is off ('' while it is on): for the stats line."""
        if self.steps < 2 or self.best_k() > 0:
            return ""
        v = self.verify_estimate()
        c = (self.draft_cost or 0.0) / v[0]
        return (f"speculation off: drafting is slower than plain decoding here, by the controller's estimates "
                f"(per-token acceptance {self.acceptance:.2f}, a draft token costing {c:.2f} target steps); "
                f"probing again every "
                f"{self.probe_every} steps")

    # ----------------------------------------------------------------------------- the protocol
    def next_k(self) -> int:
        if self.steps == 0:
            return 0
        if self.steps == 1:
            return self.initial_k
        k = self.best_k()
        if k > 0:
            self.off_steps = 0
            if self.steps % self.explore_every == 0:
                self.explorations += 1
                step = 1 if self.explorations % 2 else -1
                return min(max(k + step, 1), self.max_k)
            return k
        self.off_steps += 1
        if self.last_probe_full or self.off_steps >= self.probe_every:
            self.off_steps = 0
            return self.probe_k
        return 0

    def update(self, k: int, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.steps += 1
        self._best = None
        self.verify_cost[drafted] = self._ema(self.verify_cost[drafted], verify_s)
        if drafted > 0:
            self.draft_cost = self._ema(self.draft_cost, draft_s / drafted)
            rejections = 1 if accepted < drafted else 0
            self.acc_num = (1 - self.alpha) * self.acc_num + self.alpha * accepted
            self.acc_den = (1 - self.alpha) * self.acc_den + self.alpha * (accepted + rejections)
            self.last_probe_full = accepted == drafted and self.best_k() == 0


# ---- seeded sampling: a k schedule that depends on acceptance counts only ----------------------------
# Adaptive k for seeded sampling: the same seed gives the same text, in every run and process.
# 
# Which random numbers a step draws depends on its k, so a k schedule driven by measured timings (noise)
# makes seeded sampling irreproducible. When a seed is given, the Generator uses `CountOnlyAdaptiveK`:
# the same controller as `AdaptiveK`, fed a fixed cost model instead of the clock, and started fresh for
# every call. Its k schedule is then a function of acceptance counts only (which the seed fixes).
# 
# Greedy decoding draws no random numbers: its output never depends on k, so greedy calls keep the timed
# `AdaptiveK` even when a seed is passed (Generator._run).
#
# Cost model (in units of one plain target step): one verify pass over k + 1 tokens costs
# `1 + verify_slope * k`; one draft token costs `draft_cost` (the draft/target ratio of the weight bytes the
# ONNX Runtime graphs stream per token: a quantized draft, e.g. the target's own int4 copy, costs its bytes, not
# its parameter count; small constants for Medusa heads and n-gram look-ups).



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


def weight_bytes(manifest, role: str) -> float:
    """Bytes of weights ONNX Runtime streams per token for `role`: the external data of the graph its runners
    load (quantized when the model is), from the manifest's file list; else 4 bytes per parameter."""
    entry = manifest.models[role]
    for onnx in (entry.ort_onnx, entry.ort_fused_onnx):  # a lean bundle may keep only the fused graph
        data = manifest.files.get(f"{onnx}.data") if onnx else None
        if data is not None and data.size > 0:
            return float(data.size)
    return 4.0 * float(entry.num_parameters or 0)


def head_weight_bytes(manifest) -> float:
    """Bytes of weights the draft head streams per drafted token: its graph's external data less its input
    embedding, of which one row is gathered (fp16 [V, D] in an fp32 head; block-quantized, fp16 scales, in a
    quantized one: compiler/draft_head_quantize.py)."""
    h = manifest.draft_head
    data = manifest.files.get(h.onnx_data) if h.onnx_data else None
    if data is None:
        return 0.0
    v, d = manifest.models["target"].decoder_config.vocab_size, h.hidden_size
    q = h.quantization or {}
    quantized = (q.get("embedding") or {}).get("storage") == "GatherBlockQuantized"
    embedding = v * d * q["bits"] / 8 + v * (d // q["block_size"]) * 2 if quantized else v * d * 2
    return max(float(data.size) - embedding, 0.0)


def model_draft_cost(method: str, manifest) -> float:
    """The fixed per-token draft cost for `method`, relative to one target step."""
    head = method in ("head", "hybrid-head") or method == "hybrid" and "draft" not in manifest.models
    if head and manifest.draft_head is not None:  # hybrid in a bundle with a head and no draft model: the head
        target, draft = weight_bytes(manifest, "target"), head_weight_bytes(manifest)
        return max(draft / target, MEDUSA_DRAFT_COST) if target > 0 and draft > 0 else 0.1
    if method in ("draft", "hybrid") and "draft" in manifest.models:  # hybrid: the draft model's cost bounds it
        target, draft = weight_bytes(manifest, "target"), weight_bytes(manifest, "draft")
        return draft / target if target > 0 and draft > 0 else 0.1
    if method == "medusa":
        return MEDUSA_DRAFT_COST
    return NGRAM_DRAFT_COST
