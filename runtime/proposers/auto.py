"""`--method auto` (the default): one draft tree per step from every source the bundle has, sized by measured goodput.

Sources (keys of the acceptance estimates: (source, depth, rank)):
* `ngram` / `ngram1` / `ngramL`: prompt-lookup continuations of the suffix n-gram (sizes >= 2 / size 1 / a match
  that runs COPY_RUN tokens back: text being copied) at its latest occurrences (ngram_branches.py), rank = the
  branch's order;
* `table`: Token Recycling's successor table (recycle_table.py, shared per bundle, seeded at compile), expanded from
  the pending token heaviest paths first (`_expand_table`), rank = the successor's rank under its parent; where the
  table knows how sure the target was (`conf`, from a verify row), the source is `tablep` and the "rank" is that
  confidence's bin (CONF_EDGES): the estimates then follow the target's certainty, not only the rank;
* `store` / `storeL`: the continuations of the context's last 1-4 tokens (3-4: `storeL`) in a datastore of the
  target's own answers (store.py, REST), in bundles that carry one; "rank" = the bin of the continuation's share;
* `draft`: a draft model's greedy chain with its 2nd / 3rd choices where it is unsure (draft_source.py), in bundles
  compiled with --draft, only where the sizing says its cost pays;
* `head`: a draft head's (plain or fused) chain with its runners-up, the same way (head_source.py), in bundles
  compiled with --draft head:DIR.

Every step the candidates of all sources go into one trie (shared prefixes once); each candidate's probability of
being accepted is the product of the running conditional acceptances along its path (runtime/tree_budget.py), and
the verify pass carries the node set and size S that maximise predicted tokens per second, (1 + expected accepted)
/ (overhead + T(S)) with T(S) measured per bundle and device: none at all (a plain step) when nothing pays. After
the step every candidate, verified or not, is scored against what the target committed, so estimates follow the
text and a request whose drafts stop paying decodes plain within a few steps, then resumes when they recover.

Drafts are point masses (the draft model's are its argmaxes), so sampling stays lossless with SpecInfer's tree rule
(runtime/acceptance.py); a target without tree support (int4 at accuracy level 4, docs/trees.md) gets the best
chain, sized the same way.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import time
import weakref

import numpy as np

from specrt.runtime.proposers.base import Proposal
from specrt.runtime.proposers.ngram_branches import NgramBranches, match_length
from specrt.runtime.proposers.recycle_table import SuccessorTable
from specrt.runtime.proposers.store import add_nodes, store_for
from specrt.runtime.proposers.token_tree import RANK_PRIOR, DraftTrie
from specrt.runtime.tree_budget import (MAX_DEPTH_KEY, NodeStats, PassCosts, choose, fixed_costs, path_probs,
                                       preorder)

NGRAM_BRANCHES = 3  # continuations per n-gram source
COPY_RUN = 6  # a continuation whose match runs this many tokens back is `ngramL` (the text is being copied)
TABLE_NODES = 24  # candidates from the successor table per step
MAX_CANDIDATES = 64
# a-priori conditional acceptances (per rank at depth 1, and deeper for rank 0): properties of the sources, set
# before any measurement and never fitted to a benchmark; the running estimates replace them within a few steps
PRIORS = {"ngram": ((0.6, 0.3, 0.2), 0.75), "ngram1": ((0.35, 0.2, 0.12), 0.6), "ngramL": ((0.8, 0.4, 0.25), 0.85),
          "table": (RANK_PRIOR, 0.5), "tablep": ((0.75, 0.55, 0.4, 0.25, 0.14, 0.07, 0.03, 0.01), 0.85),
          "store": ((0.6, 0.45, 0.3, 0.2, 0.12, 0.06, 0.03, 0.01), 0.75),
          "storeL": ((0.7, 0.5, 0.35, 0.2, 0.12, 0.06, 0.03, 0.01), 0.8), "draft": ((0.6, 0.15, 0.08), 0.7),
          "head": ((0.4, 0.12, 0.06), 0.5)}
CONF_EDGES = (0.9, 0.75, 0.55, 0.35, 0.2, 0.1, 0.04)  # `tablep` bins: bin b holds conf in [EDGES[b], EDGES[b - 1])
NEG_EDGES = tuple(-e for e in CONF_EDGES)  # ascending, for bisect
PRIOR = RANK_PRIOR + (RANK_PRIOR[-1],) * 56  # a rank's weight where the table has no confidence (up to 64 ranks)


class AutoState:
    """What `auto` learns per loaded bundle and keeps across requests: pass costs and acceptance estimates."""

    def __init__(self, costs: PassCosts) -> None:
        self.costs = costs
        self.stats = NodeStats(PRIORS)
        self.last_nodes = 0  # nodes of the last step's tree (the stats' num_speculative_tokens)
        self.plain_steps = 0  # consecutive steps that chose plain decoding
        self.draft_s = 0.0  # seconds the draft model ran in the last step (kept out of the proposer's overhead)


_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_STATES_LOCK = threading.Lock()


def state_for(gen) -> AutoState:
    """The state shared by `gen`'s requests, primed with its load-time pass costs (timed now if it loaded without)."""
    with _STATES_LOCK:
        state = _STATES.get(gen)
        if state is None:
            if gen._load_costs is None:
                gen.warmup()
            state = AutoState(PassCosts(gen._load_costs[0]))
            _STATES[gen] = state
        return state


def use_free_rows(gen) -> AutoState:
    """`specrt bench --free-rows`: from now on `gen`'s `auto` prices a pass of any size at T(1), so its trees take
    every candidate worth anything up to the node cap (a fresh state; the successor table is kept). Measures the
    MAT a device where verify rows cost ~nothing would reach; its speeds on this machine mean nothing."""
    with _STATES_LOCK:
        if gen._load_costs is None:
            gen.warmup()
        state = _STATES[gen] = AutoState(PassCosts(gen._load_costs[0], free_rows=True))
        return state


class AutoProposer:
    name = "auto"

    def __init__(self, table: SuccessorTable, state: AutoState, eos_ids: frozenset[int] = frozenset(),
                 trees: bool = True, min_n: int = 1, max_n: int = 3, draft=None, head=None,
                 sources: frozenset[str] | None = None, store=None) -> None:
        self.table, self.state, self.eos_ids, self.trees = table, state, eos_ids, bool(trees)
        # which of `ngram` / `recycle` / `store` it drafts from (auto_sources.py; draft, head: given or None); all learn
        self.sources = frozenset(("ngram", "recycle")) if sources is None else frozenset(sources)
        self.ngram = NgramBranches(eos_ids, min_n, max_n)
        self.draft = draft  # a DraftSource (draft_source.py) or None
        self.head = head  # a HeadSource (head_source.py) or None
        self.store = store if "store" in self.sources else None  # a Datastore (store.py) or None
        self.rows_seen = False
        self._tokens: np.ndarray | None = None
        self._n = 0
        self._cand: tuple[list[int], list[int], list[list[tuple]]] | None = None  # tokens, parents, keys

    # ----------------------------------------------------------------------------- the protocol
    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        self._tokens, self._n, self._cand = tokens, n, None
        self.ngram.start(tokens, n)
        if self.draft is not None:
            self.draft.start(tokens, n)
        if self.head is not None:
            self.head.start(tokens, n, target_hidden)
        if n >= 2:  # the prefill's argmax: the target's own successor of the prompt's last token
            self.table.learn_pairs(tokens[n - 2:n - 1], tokens[n - 1:n])

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        trie, keys = self.candidates(tokens, n, k)
        cand_tokens, parents = trie.tokens, trie.parents
        stats, costs = self.state.stats, self.state.costs
        table = costs.table()
        overhead = costs.overhead_s
        calls, self.state.draft_s = 0, 0.0
        for source in (self.draft, self.head):  # model-backed sources, each as deep as its cost pays
            depth = source.depth(stats, n, parents, keys, table, k, overhead, not self.trees) if source else 0
            if depth:
                t1 = time.perf_counter()
                calls_now = source.extend(trie, keys, tokens, n, depth)
                calls += calls_now
                spent = time.perf_counter() - t1
                self.state.draft_s += spent
                # this step's drafting cost joins the choice of its size (a fixed cost: its calls, never the clock,
                # so a seeded request's tree depends on the request alone)
                overhead += calls_now * source.cost_s if source.fixed else spent
        probs = path_probs(parents, [max(stats.prob(key) for key in ks) for ks in keys])
        chosen = choose(probs, parents, table, k, overhead, chain_only=not self.trees)
        order = preorder(chosen, parents, probs)
        self._cand = (list(cand_tokens), list(parents), keys)
        self.state.last_nodes = len(order)
        self.state.plain_steps = 0 if order else self.state.plain_steps + 1
        ids = np.array([cand_tokens[i] for i in order], dtype=np.int64)
        if not self.trees:
            return Proposal(ids, calls=calls, source=self.name)
        index = {node: j for j, node in enumerate(order)}
        par = np.array([index[parents[i]] if parents[i] >= 0 else -1 for i in order], dtype=np.int64)
        return Proposal(ids, parents=par, calls=calls, source=self.name)

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None:
        tokens, old = self._tokens, self._n
        if n > old:
            if self._cand is not None:
                self.state.stats.score(*self._cand, tokens[old:n].tolist())
            if not self.rows_seen:
                self.table.learn_pairs(tokens[old - 1:n - 1], tokens[old:n])
            self.ngram.index(tokens, n)
        if self.draft is not None:
            self.draft.observe(n)
        if self.head is not None:
            self.head.observe(n, target_hidden)
        self._cand = None
        self._n = n

    def observe_verify(self, fed_ids: np.ndarray, logits: np.ndarray,
                       parents: np.ndarray | None = None) -> list[int] | None:
        """fed_ids [S], logits [S, V]: every verified row refreshes the successor table (Token Recycling); returns
        the rows' argmax, which the greedy rule reuses (step.verify_rows)."""
        self.rows_seen = True
        return self.table.refresh(fed_ids, logits)  # the rows' argmax (SuccessorTable.refresh) or None

    # ----------------------------------------------------------------------------- candidates
    def candidates(self, tokens: np.ndarray, n: int, k: int) -> tuple[DraftTrie, list[list[tuple]]]:
        """Every source's candidates in one trie (at most MAX_CANDIDATES nodes, depth <= k), with each node's keys
        (source, depth, rank): a node two sources propose has both."""
        trie = DraftTrie(MAX_CANDIDATES, max_depth=max(k, 1))
        keys: list[list[tuple]] = []
        key = NodeStats.key

        def add(parent: int, token: int, k_: tuple) -> int | None:
            before = len(trie)
            node = trie.add(parent, token)
            if node is not None:
                if len(trie) > before:
                    keys.append([k_])
                elif k_ not in keys[node]:
                    keys[node].append(k_)
            return node

        rank = {"ngram": 0, "ngram1": 0, "ngramL": 0}
        branches = self.ngram.branches(tokens, n, k, 2 * NGRAM_BRANCHES) if "ngram" in self.sources else ()
        for (size, cont), start in zip(branches, self.ngram.starts if branches else ()):
            source = ("ngram1" if size < 2 else
                      "ngramL" if match_length(tokens, n, start, COPY_RUN) >= COPY_RUN else "ngram")
            if rank[source] >= NGRAM_BRANCHES:
                continue
            parent = -1
            for d, t in enumerate(cont, start=1):
                parent = add(parent, t, key(source, d, rank[source]))
                if parent is None:
                    break
            rank[source] += 1
        if "recycle" in self.sources:
            self._expand_table(trie, add, int(tokens[n - 1]), k)
        if self.store is not None:
            add_nodes(self.store, add, tokens, n, k, conf_bin, self.eos_ids)
        return trie, keys

    def _expand_table(self, trie: DraftTrie, add, root: int, k: int) -> None:
        """The successor table's TABLE_NODES heaviest paths from `root` (EAGLE-2's dynamic tree over the table): a
        path's weight is the product of its successors' confidences (RANK_PRIOR[rank] where the table has none).
        Popping (parent, rank) pushes its next sibling and its own first child: a row's confidences fall with rank,
        so the pops come heaviest first. A static rank template capped sure chains at depth 5 (24 nodes)."""
        rows: dict[int, tuple[list[int], list[float]]] = {}  # token -> its successors and their weights

        def row(tok: int) -> tuple[list[int], list[float]]:
            got = rows.get(tok)
            if got is None:  # one read per token, not per successor (ids and confidences together: a lock)
                ids, cs = self.table.entry(tok)
                got = rows[tok] = (ids, [PRIOR[r] if c != c else c for r, c in enumerate(cs)], cs)
            return got

        heap = [(-row(root)[1][0], 0, -1, 1.0, root, 0, 1)]  # (-weight, tie, parent node, parent weight, head, rank,
        count, placed = 1, 0  # depth)
        while heap and placed < TABLE_NODES:
            neg, _, parent, pw, head, r, depth = heapq.heappop(heap)
            ids, ws, cs = row(head)
            t = ids[r]
            if t < 0:
                continue
            if r + 1 < len(ids):  # the next sibling
                heapq.heappush(heap, (-pw * ws[r + 1], count, parent, pw, head, r + 1, depth))
                count += 1
            c, d = cs[r], min(depth, MAX_DEPTH_KEY)
            node = add(parent, t, ("table", d, r) if c != c else ("tablep", d, bisect.bisect_left(NEG_EDGES, -c)))
            if node is None:
                if trie.full:
                    return
                continue
            placed += 1
            if depth < k and t not in self.eos_ids:  # its first child
                heapq.heappush(heap, (neg * row(t)[1][0], count, node, -neg, t, 0, depth + 1))
                count += 1


def conf_bin(c: float) -> int:
    """The `tablep` bin of a successor's confidence: 0 for the surest (>= CONF_EDGES[0]), len(CONF_EDGES) below all."""
    return bisect.bisect_left(NEG_EDGES, -c)


def make_auto(gen, params, rng, options: dict, sources: tuple[str, ...] | None = None) -> AutoProposer:
    """The `auto` proposer for `gen` (a Generator): its shared table and state. Seeded sampling gets a fresh state
    with fixed costs and the bundle's seed table: the trees, hence the random numbers drawn, depend only on the
    request (the same text in every run and process). `sources`: the request's resolved auto_sources (None: all)."""
    use = frozenset(sources) if sources is not None else frozenset(("ngram", "recycle", "draft", "head", "store"))
    from specrt.runtime.proposers.recycle_table import request_table

    seeded = params.seed is not None and not params.greedy
    state = AutoState(fixed_costs(gen.max_draft_tokens + 1)) if seeded else state_for(gen)
    trees = getattr(gen.target, "supports_tree", False)
    draft = None
    if gen.draft is not None and "draft" in use:
        from specrt.runtime.proposers.draft_source import DraftSource

        draft = DraftSource(gen.draft, gen.vocab_size, fixed=seeded)
        if seeded:  # priced by weights, never timed (as the head): a cost of 0 would never draft
            from specrt.runtime.policy import model_draft_cost

            draft.cost_s = model_draft_cost("draft", gen.manifest)
        elif gen._load_costs is not None and gen._load_costs[1] is not None:
            draft.cost_s = float(gen._load_costs[1])
            rows = gen._load_costs[2]  # None: max k <= 2 (warmup.py)
            if rows:  # (k+1)-row call over one-row call: what a row adds (docs/trees.md, "draft model")
                draft.row_frac = (rows / draft.cost_s - 1.0) / max(gen.max_draft_tokens - 1, 1)
    table = request_table(gen, params)  # seeded: the bundle's seed table, not what earlier requests taught
    from specrt.runtime.proposers.head_source import head_source

    head = head_source(gen, seeded) if "head" in use else None
    return AutoProposer(table, state, gen.eos_ids, trees, draft=draft, head=head,
                        sources=use & {"ngram", "recycle", "store"}, store=store_for(gen) if "store" in use else None,
                        **options)
