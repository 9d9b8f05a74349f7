"""A draft model as one source of `auto`'s tree (auto.py): its greedy chain, plus its 2nd and 3rd choices where it
is unsure, drafted only as deep as the sizing says its cost pays.

    src = DraftSource(runner, target_vocab)
    src.start(tokens, n)                              # lazy: nothing fed until the first drafting step
    d = src.depth(stats, tokens, parents, keys, costs, k, overhead_s, chain_only)   # 0: not worth a call
    calls = src.extend(trie, keys, tokens, n, d)      # d draft calls; nodes keyed ("draft", depth, rank)
    src.observe(n)                                    # the cache cut back to the prefix still committed

Drafts are the draft model's argmaxes (and runners-up), point masses: any deterministic proposal keeps greedy output
equal to plain and sampling lossless under the tree rule. The cache follows the committed tokens lazily as in
draft_model.py: the first drafting step after steps without the draft feeds the tokens it missed in one pass.
"""

from __future__ import annotations

import time

import numpy as np

from specrt.runtime.tree_budget import NodeStats, choose, path_probs

UNSURE = (0.6, 0.3)  # the draft's top-1 probability below which its 2nd (then also its 3rd) choice joins the tree
PREFILL_CHUNK = 256
ROW_FRAC = 1 / 32  # a call's cost per row past two, in one-row calls, before any is timed (fp32: rows are cheap)
ROW_ALPHA = 0.5  # EMA weight of a timed catch-up call in `row_frac`


def add_choices(trie, keys, parent: int, row: np.ndarray, source: str, depth: int, ids=None) -> tuple[int | None, int]:
    """A model's choice at one depth into `trie` under `parent`: its argmax, and its 2nd / 3rd where its top-1
    probability is under UNSURE, keyed (source, depth, rank). `row`: its logits; `ids` maps a logit index to a token
    id (a head's reduced vocabulary), None: the index is the id. Returns (the argmax's node or None, its token)."""
    top = np.argpartition(row, -3)[-3:] if row.size > 3 else np.arange(row.size)
    top = top[np.argsort(-row[top], kind="stable")]
    z = np.exp(row[top] - row.max())
    p1 = float(z[0] / np.exp(row - row.max()).sum())
    ranks = 1 + sum(p1 < u for u in UNSURE)
    tokens = [int(ids[i]) if ids is not None else int(i) for i in top[:ranks].tolist()]
    main = None
    for rank, tok in enumerate(tokens):
        before = len(trie)
        node = trie.add(parent, tok)
        if node is None:
            continue
        key = NodeStats.key(source, depth, rank)
        if len(trie) > before:
            keys.append([key])
        elif key not in keys[node]:
            keys[node].append(key)
        if rank == 0:
            main = node
    return main, tokens[0]


class DraftSource:
    SOURCE = "draft"  # the first element of its nodes' keys

    def __init__(self, runner, target_vocab: int, fixed: bool = False, cost_s: float = 0.0,
                 row_frac: float = ROW_FRAC) -> None:
        self.runner, self.vocab = runner, int(target_vocab)
        self.fixed = fixed  # seeded sampling: the cost per call is a constant, never timed
        self.cost_s = float(cost_s)  # seconds per one-row draft call (load-time timing, then an EMA of its calls)
        # what each row past two adds to a call, in one-row calls: the catch-up after steps without the draft feeds
        # every row it missed in one call (the prompt on its first), ~0.25 each in int4 (MatMulNBits), ~0.03 in fp32
        # (load-time timing of a (k+1)-row call, then an EMA of its catch-up calls)
        self.row_frac = min(max(float(row_frac), 0.0), 1.0)
        self.last_s = 0.0  # seconds this source drafted in the last step
        self._tokens: np.ndarray | None = None
        self._base = 0  # committed length when the chain was drafted
        self._fed: list[int] = []  # draft tokens fed after it (the chain but its last)

    def start(self, tokens: np.ndarray, n: int) -> None:
        self._tokens, self._fed = tokens, []
        self.runner.set_argmax_only(False)  # runners-up need full rows
        self.runner.reset()

    def depth(self, stats: NodeStats, n: int, parents, keys, costs: list[float], k: int, overhead_s: float,
              chain_only: bool) -> int:
        """How many draft tokens to run: the d whose best tree (the other sources' candidates plus a draft chain of
        d nodes, each worth its running path probability less what the other candidates already give at its
        depth) has the highest predicted rate counting d draft calls; 0 when none beats the tree without it."""
        if self.cost_s <= 0 or self._tokens is None:
            return 0
        probs = path_probs(parents, [max(stats.prob(key) for key in ks) for ks in keys])
        depth_of = np.zeros(len(parents) + 1, dtype=np.int64)
        for i, p in enumerate(parents):
            depth_of[i + 1] = depth_of[p + 1] + 1
        have = {}
        for i, pr in enumerate(probs):
            have[int(depth_of[i + 1])] = max(have.get(int(depth_of[i + 1]), 0.0), float(pr))
        catch_up = self.call_cost(self._unseen(n))  # its first call feeds 1 row, or more after steps without it
        best_d, best_rate = 0, self._rate(probs, parents, costs, k, overhead_s, chain_only)
        chain_p, extra = 1.0, []
        for d in range(1, k + 1):
            chain_p *= stats.prob(NodeStats.key(self.SOURCE, d, 0))
            extra.append(max(chain_p - have.get(d, 0.0), 0.0))
            p = np.concatenate([probs, extra])
            par = list(parents) + [-1] + [len(parents) + j for j in range(d - 1)]
            rate = self._rate(p, par, costs, k, overhead_s + (d - 1 + catch_up) * self.cost_s, chain_only)
            if rate > best_rate:
                best_d, best_rate = d, rate
        return best_d

    def _unseen(self, n: int) -> int:
        return n - min(self.runner.length, n - 1)

    def call_cost(self, rows: int) -> float:
        """Feeding `rows` rows (in prefill chunks), in one-row calls (two rows: one, as after an accepted chain)."""
        return -(-max(rows, 1) // PREFILL_CHUNK) + self.row_frac * max(rows - 2, 0)

    @staticmethod
    def _rate(probs, parents, costs, k, overhead_s, chain_only) -> float:
        chosen = choose(probs, parents, costs, k, overhead_s, chain_only, margin=1.0)
        return (1.0 + float(sum(probs[i] for i in chosen))) / (overhead_s + costs[len(chosen)])

    def extend(self, trie, keys, tokens: np.ndarray, n: int, d: int) -> int:
        """Run the draft d tokens deep from tokens[:n] and add its chain (and runners-up where unsure) to `trie`;
        returns the draft calls made."""
        r = self.runner
        t0 = time.perf_counter()
        r.truncate(min(r.length, n - 1))
        unseen = n - r.length
        calls = -(-unseen // PREFILL_CHUNK)
        row = r.prefill(tokens[r.length:n], PREFILL_CHUNK)
        first_s = time.perf_counter() - t0
        self._base, self._fed = n, []
        parent = -1
        for depth in range(1, d + 1):
            main, top = add_choices(trie, keys, parent, row[:self.vocab], self.SOURCE, depth)
            if main is None or depth == d:
                break
            self._fed.append(top)
            row = r.forward(np.array([top], dtype=np.int64))[-1]
            calls += 1
            parent = main
        self._timed(t0, calls, unseen, first_s)
        return calls

    def _timed(self, t0: float, calls: int, rows: int = 1, first_s: float = 0.0) -> None:
        """This step's drafting time, and (not for a fixed cost) the running seconds per one-row call and, from a
        first call over `rows` > 3 rows that took `first_s`, what a row adds (`row_frac`)."""
        self.last_s = time.perf_counter() - t0
        if self.fixed:
            return
        if rows > 3 and self.cost_s > 0:  # a catch-up: its rows' price, the one-row calls after it their own
            chunks = -(-rows // PREFILL_CHUNK)
            per_row = (first_s / self.cost_s - chunks) / (rows - 2)
            self.row_frac = min(max((1 - ROW_ALPHA) * self.row_frac + ROW_ALPHA * per_row, 0.0), 1.0)
            if calls <= chunks:
                return
            per_call = (self.last_s - first_s) / (calls - chunks)
        else:
            per_call = self.last_s / max(calls, 1)
        self.cost_s = per_call if self.cost_s <= 0 else 0.75 * self.cost_s + 0.25 * per_call

    def observe(self, n: int) -> None:
        """tokens[:n] committed: keep the cached chain tokens the committed text confirms."""
        if self._tokens is None:
            return
        agree = 0
        committed = self._tokens[self._base:n].tolist()
        while agree < min(len(self._fed), len(committed)) and self._fed[agree] == committed[agree]:
            agree += 1
        self.runner.truncate(min(self.runner.length, self._base + agree, n - 1))
        self._fed = self._fed[:agree]
