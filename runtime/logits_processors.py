"""Penalties, logit_bias and logprobs of the target's distribution, per verified position (issue 53).

`LogitsParams` is the request's part (validated once); `LogitsState` is one sequence's running state: counts of
the generated tokens (presence / frequency) and a mask of prompt + generated tokens (repetition), kept
incrementally, so a step costs O(S * V) for S verified rows and nothing proportional to the context.

Semantics (each row of a verify pass sees the counts as of its position: row i counts the fed drafts
d_1 .. d_{i-1} as if accepted, so speculative output equals plain output under any penalty):
* logit_bias (OpenAI): logits[t] += bias[t], bias in [-100, 100]; -100 bans t (its logit becomes -inf);
* repetition_penalty r (transformers / vLLM): for every t in prompt + generated, a positive logit is divided
  by r, a negative one multiplied by r;
* frequency_penalty f, presence_penalty p (OpenAI, over generated tokens only):
  logits[t] -= f * count[t] + p * (count[t] > 0).
Order: bias, then repetition, then frequency / presence (vLLM v1's sampler order).
Logprobs: log-softmax of the processed logits, before temperature / top-k / top-p and before a structured-output
mask: the model's distribution under the request's penalties and bias.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from specrt.core.errors import InvalidArgument

MAX_TOP_LOGPROBS = 20
BAN = -100.0


class _FieldError(InvalidArgument):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _number(name: str, v: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) \
            or not (lo < v if lo_open else lo <= v) or v > hi:
        raise _FieldError(name, f"{name} must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def check_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """{token id (int or a string of one): bias} -> sorted ((id, bias), ...); ids >= 0, bias in [-100, 100]."""
    if bias is None:
        return ()
    items = bias.items() if isinstance(bias, Mapping) else bias
    out = {}
    try:
        for tid, b in items:
            # a string key is the decimal digits of one id, as OpenAI's JSON keys are ("01", " 1" or another
            # script's digits are not an id: they would name the same token as "1" and one would be lost)
            key = int(tid) if isinstance(tid, str) and tid.isascii() and tid.isdigit() and str(int(tid)) == tid else tid
            if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or key < 0:
                raise _FieldError("logit_bias", f"logit_bias keys must be token ids (integers >= 0), got {tid!r}")
            if int(key) in out:
                raise _FieldError("logit_bias", f"logit_bias names token {int(key)} twice")
            out[int(key)] = _number("logit_bias", b, -100, 100)
    except _FieldError:
        raise
    except (TypeError, ValueError):
        raise _FieldError("logit_bias", f"logit_bias must map token ids to numbers, got {bias!r:.60}") from None
    return tuple(sorted(out.items()))


@dataclasses.dataclass(frozen=True)
class LogitsParams:
    presence_penalty: float = 0.0  # [-2, 2], OpenAI
    frequency_penalty: float = 0.0  # [-2, 2], OpenAI
    repetition_penalty: float = 1.0  # (0, 2], vLLM; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # sorted (token id, bias)
    logprobs: int | None = None  # None: no logprobs; N >= 0: the emitted token's and the top N alternatives

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            object.__setattr__(self, name, _number(name, getattr(self, name), -2, 2))
        object.__setattr__(self, "repetition_penalty",
                           _number("repetition_penalty", self.repetition_penalty, 0, 2, lo_open=True))
        object.__setattr__(self, "logit_bias", check_bias(self.logit_bias))
        n = self.logprobs
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer))
                              or not 0 <= n <= MAX_TOP_LOGPROBS):
            raise _FieldError("logprobs", f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {n!r}")

    @property
    def changes_logits(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    @property
    def active(self) -> bool:
        return self.changes_logits or self.logprobs is not None

    def check_vocab(self, vocab_size: int) -> None:
        for tid, _ in self.logit_bias:
            if tid >= vocab_size:
                raise _FieldError("logit_bias", f"logit_bias token id {tid} is outside the vocabulary "
                                                f"[0, {vocab_size})")


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the top N (token id, logprob), most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[S, V] -> [S, V] float64."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def process(logits: np.ndarray, params: LogitsParams, counts: np.ndarray, seen: np.ndarray,
            fed: np.ndarray) -> np.ndarray:
    """logits [S, V] of one verify pass -> processed copy [S, V] (float32).

    counts [V] int: generated tokens committed so far; seen [V] bool: prompt + generated; fed [>= S-1]: the
    tokens fed after the pending one (drafts): row i counts fed[:i] as generated."""
    s, v = logits.shape
    out = logits.astype(np.float32, copy=True)
    if not params.changes_logits:
        return out
    if params.logit_bias:
        ids = np.fromiter((t for t, _ in params.logit_bias), np.int64)
        bias = np.fromiter((b for _, b in params.logit_bias), np.float32)
        out[:, ids] += bias
        out[:, ids[bias <= BAN]] = -np.inf
    r = np.float32(params.repetition_penalty)
    f, p = np.float32(params.frequency_penalty), np.float32(params.presence_penalty)
    pre = {(i, int(t)): out[i, int(t)] for i in range(1, s) for t in set(fed[:i].tolist())}  # after bias only
    if r != 1:  # dense part: the committed tokens, the same for every row (only their columns are touched)
        cols = np.flatnonzero(seen)
        x = out[:, cols]
        out[:, cols] = np.where(x > 0, x / r, x * r)
    if f or p:
        cols = np.flatnonzero(counts)
        out[:, cols] -= _penalty(counts[cols].astype(np.float32), f, p)
    for (i, t), x in pre.items():  # row i's drafts fed[:i], counted as if accepted: a few scalars per row
        c = np.float32(counts[t] + int((fed[:i] == t).sum()))
        if r != 1:
            x = x / r if x > 0 else x * r
        out[i, t] = x - _penalty(c, f, p) if (f or p) else x
    return out


def _penalty(c: np.ndarray, f: np.float32, p: np.float32) -> np.ndarray:
    """float32 counts -> f * count + p * (count > 0), in float32 (the same arithmetic for arrays and scalars)."""
    return (f * c + p * (c > 0).astype(np.float32)).astype(np.float32)


def token_logprobs(rows: np.ndarray, emitted: list[int], top_n: int) -> list[TokenLogprob]:
    """rows [>= len(emitted), V] processed logits; emitted[i] was chosen at row i."""
    lp = log_softmax(rows[:len(emitted)])
    out = []
    for i, t in enumerate(emitted):
        top: tuple[tuple[int, float], ...] = ()
        if top_n:
            idx = np.argpartition(-lp[i], top_n - 1)[:top_n]
            idx = idx[np.argsort(-lp[i][idx], kind="stable")]
            top = tuple((int(j), float(lp[i, j])) for j in idx)
        out.append(TokenLogprob(int(t), float(lp[i, t]), top))
    return out


class LogitsState:
    """One sequence's counts and the last processed rows; the decode loop calls `apply` on every target
    output (prefill's last row, each verify pass) and `commit` with the tokens it emitted from it."""

    def __init__(self, params: LogitsParams, vocab_size: int, prompt_ids: np.ndarray) -> None:
        self.params = params
        self.counts = np.zeros(vocab_size, dtype=np.int32)  # [V] generated
        self.seen = np.zeros(vocab_size, dtype=bool)  # [V] prompt + generated
        self.seen[np.asarray(prompt_ids, dtype=np.int64)[np.asarray(prompt_ids) < vocab_size]] = True
        self.logprobs: list[TokenLogprob] = []  # of every committed token, in order (when params.logprobs)
        self._rows: np.ndarray | None = None

    def apply(self, logits: np.ndarray, fed: np.ndarray) -> np.ndarray:
        """logits [S, V] (S = len(fed) + 1) -> processed [S, V]; rows kept for `commit`'s logprobs."""
        if logits.shape[1] > self.counts.size:  # a runner's padded vocabulary: counts cover every column
            grow = logits.shape[1] - self.counts.size
            self.counts, self.seen = np.pad(self.counts, (0, grow)), np.pad(self.seen, (0, grow))
        out = process(logits, self.params, self.counts[:logits.shape[1]], self.seen[:logits.shape[1]], fed)
        self._rows = out
        return out

    def draft_row(self, logits_row: np.ndarray, fed: np.ndarray) -> np.ndarray:
        """A draft model's logits [V'] for the position after `fed` (its drafts so far, as if accepted) -> the
        row processed as the target's will be (acceptance; O(V) a draft token). Nothing is kept."""
        w = logits_row.size
        counts, seen = self.counts, self.seen
        if w > counts.size:
            counts, seen = np.pad(counts, (0, w - counts.size)), np.pad(seen, (0, w - seen.size))
        counts, seen = counts[:w].copy(), seen[:w].copy()
        fed = np.asarray(fed, dtype=np.int64)
        fed = fed[fed < w]
        np.add.at(counts, fed, 1)
        seen[fed] = True
        return process(logits_row[None, :], self.params, counts, seen, fed[:0])[0]

    def commit(self, emitted: list[int]) -> None:
        """The tokens emitted from the last `apply`'s rows (emitted[i] chosen at row i)."""
        if self.params.logprobs is not None and self._rows is not None:
            self.logprobs.extend(token_logprobs(self._rows, emitted, self.params.logprobs))
        ids = np.asarray(emitted, dtype=np.int64)
        np.add.at(self.counts, ids, 1)
        self.seen[ids] = True
        self._rows = None
