"""Sampling parameters and the logits warping applied identically to draft and target."""

from __future__ import annotations

import dataclasses

import numpy as np

from specrt.core.errors import BackendError, InvalidArgument


# Below MIN_TEMPERATURE, logits / T overflow (5e-324 gives inf - inf = NaN); use 0 for greedy instead.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 1e6


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None
    min_p: float = 0.0  # 0 = off; else tokens below min_p x the likeliest token's probability are dropped

    def __post_init__(self) -> None:
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):  # also NaN
            raise InvalidArgument(f"temperature must be >= 0: 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE:g}], "
                                  f"got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise InvalidArgument(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidArgument(f"top_k must be >= 0, got {self.top_k}")
        if not (0 <= self.min_p <= 1):  # also NaN
            raise InvalidArgument(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or not 0 <= self.seed < 2**63):
            raise InvalidArgument(f"seed must be an integer in [0, 2**63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """logits [N, V] -> probabilities [N, V] (float64) after temperature, top-k, top-p and min-p (transformers' and
    vLLM's order)."""
    x = logits.astype(np.float64) / params.temperature
    v = x.shape[-1]
    if 0 < params.top_k < v:
        kth = np.partition(x, v - params.top_k, axis=-1)[:, v - params.top_k][:, None]  # [N, 1]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    probs = np.exp(x)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        mass_before = np.cumsum(sorted_p, axis=-1) - sorted_p
        drop = np.zeros_like(probs, dtype=bool)
        np.put_along_axis(drop, order, mass_before >= params.top_p, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    if params.min_p > 0.0:  # the likeliest token always stays (p >= min_p x p)
        probs = np.where(probs < params.min_p * probs.max(axis=-1, keepdims=True), 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    if not np.isfinite(probs).all():  # NaN / Inf logits from a broken model: never sample from them
        raise BackendError("the model produced non-finite logits (NaN/Inf); its weights or graph are broken")
    return probs


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from probs [V] by inverse CDF (one uniform from the explicit generator)."""
    cdf = np.cumsum(probs)
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(idx, probs.size - 1)
