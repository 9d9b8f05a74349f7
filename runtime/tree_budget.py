"""Sizing a draft tree by measured goodput (docs/trees.md, "Sizing"): which candidate nodes one verify pass carries.

    costs = PassCosts(warm_up_seconds)         # T(S): seconds of a target pass over S rows, S = 1 .. max_rows
    stats = NodeStats()                        # conditional acceptance per (source, depth, rank)
    p = path_probs(parents, [stats.prob(key) for key in keys])       # P(node accepted), per candidate
    chosen = choose(p, parents, costs.table(), max_nodes, overhead_s)  # indices of the nodes to verify
    stats.score(tokens, parents, keys, committed)   # after the step: which candidates the target agreed with

The anchors are EAGLE-2's dynamic tree (the expected accepted length of a tree is the sum over its nodes of the
probability that the node's whole root path is accepted) and Sequoia's budgeted tree (the best tree for a node
budget). A node's path probability is the product of the conditional acceptances along its path, each estimated per
(source, depth, branch rank) from what the target actually committed. For a budget of m nodes the best
prefix-closed set is the m nodes of highest path probability (a child's is never above its parent's), so one sort
gives every budget's best tree, and the pass size is the one that maximises predicted tokens per second:

    S* = argmax_S  (1 + sum of the S - 1 best path probabilities) / (overhead + T(S))

S = 1 is plain decoding (no drafts), so a request whose drafts stop paying decodes plain; its candidates are still
scored on the committed text, so it speculates again when they recover. T(S) comes from the costs timed when the
bundle was loaded (runtime/warmup.py), scaled by the ratio of the step times measured since to them (what the
loop adds per pass: acceptance, the table's refresh; and whatever else runs on the machine).
"""

from __future__ import annotations

import numpy as np

DECAY = 0.95  # weight of a key's older trials per new trial: about the last 20 trials count
FAST_DECAY, FAST_CAP = 0.8, 1.5  # ... capped at FAST_CAP x the last ~5 trials' rate (+ 0.01): a change in the
# text shows there within a few steps (drafts that stop paying stop), while the estimate is the steadier long one
PRIOR_WEIGHT = 2.0  # the prior counts as this many trials
MARGIN = 1.03  # drafts must beat plain decoding's predicted rate by this factor (timing noise)
RATIO_ALPHA = 0.2  # EMA weight of a step in the measured / load-time cost ratio
RELAX = 0.1  # per plain step, how far the drafting passes' ratio moves back to the plain passes' one
MAX_DEPTH_KEY = 8  # depths past this share one estimate


class PassCosts:
    """T(S) for S = 1 .. len(load_costs): the load-time seconds per pass size, times a measured ratio (one for
    plain passes, one for passes with drafts), non-decreasing in S. `fixed=True` never learns (seeded sampling:
    the sizes, hence the random numbers drawn, must not depend on timings). `free_rows=True` prices every pass
    at T(1) (`specrt bench --free-rows`: the trees a device where verify rows cost ~nothing would draft)."""

    def __init__(self, load_costs, fixed: bool = False, free_rows: bool = False) -> None:
        base = [float(c) for c in load_costs]
        if not base or any(not np.isfinite(c) or c <= 0 for c in base):
            raise ValueError(f"pass costs must be positive seconds per pass size, got {load_costs!r}")
        for i in range(1, len(base)):  # more rows never cost less: noise cannot make drafting look free
            base[i] = max(base[i], base[i - 1])
        self.base = base
        self.fixed, self.free_rows = fixed, bool(free_rows)
        self.ratio = {False: 1.0, True: 1.0}  # measured / load-time, for plain passes and passes with drafts
        self.overhead_s = 0.0  # EMA of the proposer's seconds per step (building and sizing the tree)

    @property
    def max_rows(self) -> int:
        return len(self.base)

    def observe(self, rows: int, seconds: float, overhead_s: float = 0.0) -> None:
        if self.fixed or not 1 <= rows <= self.max_rows or seconds <= 0:
            return
        key = rows > 1
        r = seconds / self.base[rows - 1]
        self.ratio[key] = (1 - RATIO_ALPHA) * self.ratio[key] + RATIO_ALPHA * min(max(r, 0.2), 5.0)
        if not key:  # plain steps never time a pass with drafts: its ratio relaxes towards the plain one, so one
            # slow drafting pass (a busy machine) cannot keep a request plain for good
            self.ratio[True] += RELAX * (self.ratio[False] - self.ratio[True])
        self.overhead_s = (1 - RATIO_ALPHA) * self.overhead_s + RATIO_ALPHA * max(overhead_s, 0.0)

    def table(self) -> list[float]:
        """[max_rows] predicted seconds of a pass over S = 1 .. max_rows rows."""
        out = [self.base[0] * self.ratio[False]]
        if self.free_rows:
            return out * self.max_rows
        for s in range(2, self.max_rows + 1):
            out.append(max(self.base[s - 1] * self.ratio[True], out[-1]))
        return out


def fixed_costs(max_rows: int, slope: float = 0.05) -> PassCosts:
    """A cost model for seeded sampling: a pass of S rows costs 1 + slope (S - 1) plain steps (runtime/policy.py's
    VERIFY_SLOPE), never timed."""
    return PassCosts([1.0 + slope * s for s in range(max_rows)], fixed=True)


class NodeStats:
    """Conditional acceptance P(node accepted | its parent accepted) per key (source, depth, rank): decayed counts
    (`DECAY` per trial, ~20 trials) starting from a prior worth `PRIOR_WEIGHT` trials, which decays like them, capped
    at `FAST_CAP` x the rate of the last ~5 trials (`FAST_DECAY`): drafts that stop being accepted stop being drafted
    within a few steps, while a few misses among many hits do not sink a steady estimate (a 5-trial estimate alone
    was noisier: 2.7% less modeled goodput on SmolLM2 fp32, docs/trees.md). `priors` maps a source to its per-rank
    depth-1 prior and deeper prior; unknown sources get `default`."""

    def __init__(self, priors: dict[str, tuple[tuple[float, ...], float]] | None = None,
                 default: tuple[tuple[float, ...], float] = ((0.3,), 0.5)) -> None:
        self.priors = dict(priors or {})
        self.default = default
        self.counts: dict[tuple[str, int, int], list[float]] = {}  # key -> [successes, trials], decayed

    @staticmethod
    def key(source: str, depth: int, rank: int) -> tuple[str, int, int]:
        return source, min(int(depth), MAX_DEPTH_KEY), int(rank)

    def prior(self, key: tuple[str, int, int]) -> float:
        ranks, deeper = self.priors.get(key[0], self.default)
        first = ranks[min(key[2], len(ranks) - 1)]
        return first if key[1] <= 1 else min(deeper, 1.0) * first / ranks[0]

    def prob(self, key: tuple[str, int, int]) -> float:
        c = self.counts.get(key)
        return min(c[0] / c[1], FAST_CAP * c[2] / c[3] + 0.01) if c is not None else self.prior(key)

    def trial(self, key: tuple[str, int, int], accepted: bool) -> None:
        c = self.counts.get(key)
        if c is None:  # the prior as PRIOR_WEIGHT pseudo-trials, decayed like the others: the estimate becomes
            p = PRIOR_WEIGHT * self.prior(key)  # the recent rate
            c = self.counts[key] = [p, PRIOR_WEIGHT, p, PRIOR_WEIGHT]  # [successes, trials] long, then fast
        hit = 1.0 if accepted else 0.0
        c[0], c[1] = DECAY * c[0] + hit, DECAY * c[1] + 1.0
        c[2], c[3] = FAST_DECAY * c[2] + hit, FAST_DECAY * c[3] + 1.0

    def score(self, tokens, parents, keys, committed) -> int:
        """After a step: every candidate whose parent the committed tokens confirm (and whose depth they reach) is
        a trial for each of its keys, accepted when its token is the committed one. Returns how many candidates the
        committed text confirms (the tree's would-be accepted length, verified or not)."""
        committed = list(committed)
        depth = np.zeros(len(tokens) + 1, dtype=np.int64)
        matched = np.zeros(len(tokens) + 1, dtype=bool)
        matched[0] = True  # row 0: the root (the pending token)
        best = 0
        for i, (tok, par) in enumerate(zip(tokens, parents), start=1):
            depth[i] = depth[par + 1] + 1
            if not matched[par + 1] or depth[i] > len(committed):
                continue
            ok = int(tok) == int(committed[depth[i] - 1])
            for key in keys[i - 1]:
                self.trial(key, ok)
            if ok:
                matched[i] = True
                best = max(best, int(depth[i]))
        return best


def path_probs(parents, cond) -> np.ndarray:
    """[N] P(node and all its ancestors accepted) from [N] conditional acceptances (parents topological)."""
    out = np.empty(len(cond), dtype=np.float64)
    for i, (p, c) in enumerate(zip(parents, cond)):
        out[i] = (out[p] if p >= 0 else 1.0) * min(max(float(c), 0.0), 1.0)
    return out


def best_chain(probs: np.ndarray, parents) -> list[int]:
    """The root path that follows the most probable child at every node (what a chain-only target verifies)."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(int(p), []).append(i)
    path, node = [], -1
    while node in kids:
        node = max(kids[node], key=lambda i: (probs[i], -i))
        path.append(node)
    return path


def choose(probs: np.ndarray, parents, costs: list[float], max_nodes: int, overhead_s: float = 0.0,
           chain_only: bool = False, margin: float = MARGIN) -> list[int]:
    """The candidate indices to verify (in the candidates' topological order): the m of highest path probability
    for the m that maximises (1 + their sum) / (overhead_s + T(m + 1)); [] (plain) unless that beats plain by
    `margin`. `chain_only`: candidates restricted to `best_chain` first (a target that verifies chains)."""
    pool = best_chain(probs, parents) if chain_only else range(len(probs))
    order = sorted(pool, key=lambda i: (-probs[i], i))[:max(min(max_nodes, len(costs) - 1), 0)]
    plain = 1.0 / (overhead_s + costs[0])
    best, best_rate, gain = 0, plain * margin, 1.0
    for m, i in enumerate(order, start=1):
        gain += probs[i]
        rate = gain / (overhead_s + costs[m])
        if rate > best_rate:
            best, best_rate = m, rate
    return sorted(order[:best])


def preorder(chosen: list[int], parents, probs: np.ndarray) -> list[int]:
    """`chosen` (prefix-closed) in depth-first order, children by falling probability: a topological order whose
    path of first children is the most probable chain (what a loop that verifies chains keeps)."""
    keep = set(chosen)
    kids: dict[int, list[int]] = {}
    for i in chosen:
        kids.setdefault(int(parents[i]), []).append(i)
    out, stack = [], sorted(kids.get(-1, []), key=lambda i: (probs[i], -i))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(sorted((c for c in kids.get(node, []) if c in keep), key=lambda i: (probs[i], -i)))
    return out
