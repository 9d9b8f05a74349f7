"""Token Recycling merged with prompt lookup (`--method recycle`): one draft tree per step from every source.

Sources (no second model, no training):
* `ngram`  / `ngram1`: prompt-lookup continuations of the suffix n-gram (sizes >= 2 / size 1) at its latest
  few occurrences (ngram_branches.py): several branches where the text holds several;
* `table`: the successor table (recycle_table.py): the target's own top-8 next tokens per token, refreshed from
  every verify pass and kept across requests, expanded from the pending token by a static template
  (token_tree.py).

All branches go into one trie (shared prefixes once, `k` nodes at most: the node budget is the policy's k, which
the adaptive policy picks from the bundle's measured cost of a pass of k + 1 rows and the running acceptance).
The source whose branches have done best comes first, and its first branch is the tree's first chain.
Each source is scored after every step on what the target actually committed (greedy: the longest prefix of
its best branch that the committed tokens confirm), also when it was not the one verified, so the order follows
the text. A request whose best source has stopped matching (its score below GIVE_UP after PATIENCE steps)
proposes nothing, i.e. decodes plain, and keeps scoring the sources, resuming when one recovers.

Trees reach the target when `Proposal` carries `parents` (tree verification); otherwise the proposal is the
trie's first chain, extended with the table's best successors up to k. After each verify pass the loop hands
the rows it computed to `observe_verify(fed_ids, logits, parents)` (the table's refresh); until a loop does, the
table learns from the committed tokens (`observe`: each committed token moves to the front of its
predecessor's row; under greedy decoding it is the target's top-1 there).
"""

from __future__ import annotations

import numpy as np

from specrt.runtime.proposers.base import Proposal
from specrt.runtime.proposers.ngram_branches import NgramBranches
from specrt.runtime.proposers.recycle_table import SuccessorTable
from specrt.runtime.proposers.token_tree import DraftTrie, expand_template, template

SOURCES = ("ngram", "ngram1", "table")
NGRAM_BRANCHES = 3  # continuations taken per n-gram source
ALPHA = 0.4  # EMA weight of the latest step in a source's score (tokens it would have had accepted)
GIVE_UP = 0.15  # below this score (best source) drafting stops for the request...
PATIENCE = 4  # ...after at least this many scored steps
TREES = "parents" in getattr(Proposal, "__dataclass_fields__", {})  # tree verification in this build


class RecycleProposer:
    name = "recycle"

    def __init__(self, table: SuccessorTable, eos_ids: frozenset[int] = frozenset(), min_n: int = 1,
                 max_n: int = 3, trees: bool | None = None) -> None:
        self.table = table
        self.eos_ids = eos_ids
        self.ngram = NgramBranches(eos_ids, min_n, max_n)
        self.trees = TREES if trees is None else bool(trees)
        self.score = dict.fromkeys(SOURCES, 1.0)  # EMA of tokens each source's best branch would have had accepted
        self.scored = 0  # steps scored in this request
        self.rows_seen = False  # observe_verify was called: the table learns from rows, not committed pairs
        self._tokens: np.ndarray | None = None
        self._n = 0
        self._candidates: dict[str, list[int]] = {}  # each source's best branch at the last proposal
        self.lead = ""  # the best-scoring source at the last proposal (its branch comes first)

    # ----------------------------------------------------------------------------- the protocol
    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        self._tokens, self._n = tokens, n
        self.ngram.start(tokens, n)
        self.score = dict.fromkeys(SOURCES, 1.0)
        self.scored = 0
        self._candidates = {}
        if n >= 2:  # the prefill's argmax after the prompt: the target's own successor of the prompt's last token
            self.table.learn_pairs(tokens[n - 2:n - 1], tokens[n - 1:n])

    @property
    def paying(self) -> bool:
        """False once the best source's score stayed below GIVE_UP (after PATIENCE steps): decode plain."""
        return self.scored < PATIENCE or max(self.score.values()) >= GIVE_UP

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        token_ids, parents, chain = self.tree(tokens, n, k)
        if not self.paying:
            token_ids, parents, chain = token_ids[:0], parents[:0], []
        if self.trees:
            return Proposal(token_ids, parents=parents, source=self.name)
        # the chain's source names the branch in the stats (`branches`: ngram, ngram1, table)
        return Proposal(np.array(chain, dtype=np.int64), source=self.lead or self.name)

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None:
        tokens, old = self._tokens, self._n
        if n > old:
            committed = tokens[old:n].tolist()
            for source in SOURCES if self._candidates else ():
                branch, m = self._candidates.get(source, ()), 0  # a source with no branch would have had 0
                while m < min(len(branch), len(committed)) and branch[m] == committed[m]:
                    m += 1
                self.score[source] = (1 - ALPHA) * self.score[source] + ALPHA * m
            if self._candidates:
                self.scored += 1
            if not self.rows_seen:
                self.table.learn_pairs(tokens[old - 1:n - 1], tokens[old:n])
            self.ngram.index(tokens, n)
        self._candidates = {}
        self._n = n

    def observe_verify(self, fed_ids: np.ndarray, logits: np.ndarray,
                       parents: np.ndarray | None = None) -> list[int] | None:
        """fed_ids [S] (the pending token, then the verified drafts), logits [S, V]: the table's refresh; returns the
        rows' argmax, which the greedy rule reuses (step.verify_rows)."""
        self.rows_seen = True
        return self.table.refresh(fed_ids, logits)  # the rows' argmax (SuccessorTable.refresh) or None

    # ----------------------------------------------------------------------------- the tree
    def tree(self, tokens: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(token_ids [m] int64, parents [m] int64, the chain form [<= k]) from every source, m <= k."""
        succ = self.table.succ
        last = int(tokens[n - 1])
        branches: dict[str, list[list[int]]] = {"ngram": [], "ngram1": []}
        for size, cont in self.ngram.branches(tokens, n, k, 2 * NGRAM_BRANCHES):
            group = branches["ngram" if size >= 2 else "ngram1"]
            if len(group) < NGRAM_BRANCHES:
                group.append(cont)
        branches["table"] = [self._table_chain(succ, last, k)]
        self._candidates = {s: b[0] for s, b in branches.items() if b and b[0]}
        order = sorted(self._candidates, key=lambda s: -self.score[s])
        self.lead = order[0] if order else ""
        chain = self._extend(succ, list(self._candidates[order[0]]), k) if order else []
        trie = DraftTrie(k)
        if self.trees:  # the best branch up to half the budget, the others a quarter, the table's tree the rest
            first = True
            for source in order:
                for branch in branches[source]:
                    trie.add_path(branch[:max(2, k // 2) if first else max(1, k // 4)])
                    first = False
            expand_template(trie, succ, last, template(max(k, 1)), self.eos_ids)
        else:
            trie.add_path(chain)
        token_ids, parents = trie.arrays()
        return token_ids, parents, chain

    def _table_chain(self, succ: np.ndarray, last: int, k: int) -> list[int]:
        """The table's best successors from `last`, up to k, stopping at an unknown one or after an EOS."""
        return self._extend(succ, [], k, last)

    def _extend(self, succ: np.ndarray, chain: list[int], k: int, last: int | None = None) -> list[int]:
        tok = chain[-1] if chain else last
        while len(chain) < k and tok is not None and tok not in self.eos_ids:
            nxt = int(succ[tok, 0])
            if nxt < 0:
                break
            chain.append(nxt)
            tok = nxt
        return chain


def make_recycle(gen, params, options: dict) -> RecycleProposer:
    """The proposer for `gen` (a Generator): its bundle's shared successor table (seeded sampling: a fresh copy of
    the seed table, `request_table`), the request's n-gram sizes."""
    from specrt.runtime.proposers.recycle_table import request_table

    return RecycleProposer(request_table(gen, params), gen.eos_ids, **options)
