"""Choose k per request each step to maximise the batch's goodput (expected tokens per second).

A step is one batched pass over every decoding sequence's pending token (`T_batch(B)`, measured per B), plus,
for each speculating sequence, its drafting (`k * c_draft`) and one pass over its k drafts at batch 1
(`T_rows(k)`). Greedy sequences run that pass only when the batched row accepted d_1 (probability a), so a
rejected draft costs no target pass. With per-token acceptance a, a sequence with k drafts gains
a + a^2 + ... + a^k expected tokens over plain decoding. Goodput G = (B + sum gains) / (T_batch(B) + sum costs)
is a separable fractional programme: Dinkelbach's iteration (pick each k maximising gain - G * cost, update G)
reaches its optimum in a few rounds. k = 0 for every sequence is plain batched decoding, so the choice is never
predicted below it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class CostTable:
    batch: list[float]  # batch[b - 1]: seconds of one batched decode pass of b sequences
    rows: list[float]  # rows[s - 1]: seconds of one single-sequence pass of s tokens
    draft_token: float = 0.0  # seconds per drafted token (0 for n-gram)

    def t_batch(self, b: int) -> float:
        return self.batch[min(b, len(self.batch)) - 1]

    def t_rows(self, s: int) -> float:
        return self.rows[min(s, len(self.rows)) - 1]


def gain(a: float, k: int) -> float:
    """Expected extra tokens of k drafts at per-token acceptance a: a + a^2 + ... + a^k."""
    return sum(a ** i for i in range(1, k + 1))


def cost(a: float, k: int, table: CostTable, greedy: bool, draft_token: float) -> float:
    return k * draft_token + (a if greedy else 1.0) * table.t_rows(k)


def choose_ks(acceptance: list[float], max_ks: list[int], greedy: list[bool], draft_costs: list[float],
              table: CostTable, rounds: int = 4) -> list[int]:
    """k per sequence (0 allowed) maximising expected tokens / expected seconds of the step."""
    b = len(acceptance)
    if b == 0:
        return []
    ks = [0] * b
    g = b / table.t_batch(b)
    for _ in range(rounds):
        new = []
        for a, kmax, gr, cd in zip(acceptance, max_ks, greedy, draft_costs):
            best_k, best = 0, 0.0
            for k in range(1, kmax + 1):
                v = gain(a, k) - g * cost(a, k, table, gr, cd)
                if v > best:
                    best_k, best = k, v
            new.append(best_k)
        tokens = b + sum(gain(a, k) for a, k in zip(acceptance, new))
        secs = table.t_batch(b) + sum(cost(a, k, table, gr, cd) for a, k, gr, cd in zip(acceptance, new, greedy, draft_costs))
        if new == ks:
            break
        ks, g = new, tokens / secs
    return ks
