"""Offline replay (no timing, issue #51): would a REST-style datastore of the target's own answers (runtime/proposers/
store.py) add accepted tokens to `auto`'s tree at an equal node budget?

usage: python scripts/store_replay.py BUNDLE QUESTIONS.jsonl CORPUS.npz [--budgets 8,16] [--min-match 1]
CORPUS.npz: a datastore from scripts/add_store.py BUNDLE SHARDS_DIR --exclude QUESTIONS.jsonl --npz CORPUS.npz.

One plain greedy run per question (128 new tokens, chat template as the bench), then one pass over prompt + answer
for every position's logits. Each variant replays the answer step by step against the known greedy future: its
candidates (auto's own `candidates`: n-gram branches and the successor table; the datastore's tree; or both in one
trie), each scored by auto's running estimates (NodeStats), the `budget` most probable nodes verified; accepted =
the longest chosen root path the future confirms. After a step the table is refreshed from the accepted path's rows
(a real verify pass also sees the rejected nodes' rows: pessimistic for the table, alike for every variant) and
every candidate is scored, as auto does. Tables and estimates are kept across questions, one copy per variant.
Prints MAT (tokens per target pass, bonus included) per category and variant.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("questions")
    ap.add_argument("corpus")
    ap.add_argument("--budgets", default="8,16")
    ap.add_argument("--min-match", type=int, default=1)
    ap.add_argument("--store-nodes", type=int, default=24)
    ap.add_argument("--only", help="replay this category only")
    ap.add_argument("--trace", action="store_true", help="print every step's accepted length per variant")
    a = ap.parse_args()
    from specrt.bench.spec_bench import chat_ids, load_questions, pick
    from specrt.runtime import load
    from specrt.runtime.proposers.auto import PRIORS, AutoProposer, AutoState, conf_bin
    from specrt.runtime.proposers.recycle_table import SuccessorTable, table_for
    from specrt.runtime.proposers.store import Datastore
    from specrt.runtime.tree_budget import NodeStats, fixed_costs, path_probs

    gen = load(a.bundle, backend="ort", threads=1, warmup=False)
    z = np.load(a.corpus)
    store = Datastore(z["corpus"], z["order"])
    k = gen.max_draft_tokens
    seed = table_for(gen)
    priors = dict(PRIORS, store=((0.6, 0.45, 0.3, 0.2, 0.12, 0.06, 0.03, 0.01), 0.75),
                  storeL=((0.7, 0.5, 0.35, 0.2, 0.12, 0.06, 0.03, 0.01), 0.8))
    budgets = [int(b) for b in a.budgets.split(",")]
    variants = {}
    for b in budgets:
        for name, src, use_store in (("ngram", {"ngram"}, False), ("auto", {"ngram", "recycle"}, False),
                                     ("store", set(), True), ("auto+store", {"ngram", "recycle"}, True)):
            table = SuccessorTable(seed.vocab_size, seed.top_k, seed=seed.seed)
            state = AutoState(fixed_costs(k + 1))
            state.stats = NodeStats(priors)
            variants[f"{name}@{b}"] = (AutoProposer(table, state, gen.eos_ids, True, sources=frozenset(src)),
                                       use_store, b)
    mat = collections.defaultdict(lambda: [0, 0])  # (variant, category) -> [tokens, steps]
    oracle = collections.defaultdict(lambda: [0, 0])
    questions, _ = pick(gen, load_questions(a.questions), 99, 128)
    questions = [q for q in questions if a.only in (None, q.category)]
    t0 = time.time()
    for q in questions:
        ids = chat_ids(gen, [{"role": "user", "content": q.turns[0]}])
        out = np.asarray(gen.generate(ids, 128, method="none", temperature=0).token_ids, dtype=np.int64)
        full = np.concatenate([ids, out])
        gen.target.reset()
        logits = gen.target.forward(full[:-1])  # [T - 1, V]: row p predicts full[p + 1]
        gen.target.reset()
        p0 = ids.size
        agree = float(np.mean(logits[p0 - 1:].argmax(axis=1) == out))
        for name, (prop, use_store, budget) in variants.items():
            i, trace = 1, []
            prop.start(full, p0 + i)
            prop.rows_seen = True
            while i < out.size:
                n = p0 + i
                trie, keys = prop.candidates(full, n, k)
                if use_store:
                    add_store(trie, keys, store.tree(full, n, k, a.store_nodes, gen.eos_ids, a.min_match), conf_bin)
                stats = prop.state.stats
                probs = path_probs(trie.parents, [max(stats.prob(key) for key in ks) for ks in keys])
                chosen = set(sorted(range(len(probs)), key=lambda j: (-probs[j], j))[:budget])
                acc = accepted(trie.tokens, trie.parents, chosen, out[i:i + k].tolist())
                acc = min(acc, out.size - 1 - i)
                prop.observe_verify(full[n - 1:n + acc], logits[n - 1:n + acc])
                prop._cand = (list(trie.tokens), list(trie.parents), keys)
                prop.observe(n + acc + 1, 0)
                for c in (q.category, "overall"):
                    mat[(name, c)][0] += acc + 1
                    mat[(name, c)][1] += 1
                i += acc + 1
                trace.append(acc)
            if a.trace:
                print(f"  {name:14s} {out.size} tokens, {len(trace)} steps: {''.join(map(str, trace))}")
        print(f"{q.category:15s} argmax agreement {agree:.3f}  {time.time() - t0:.0f}s", flush=True)
    cats = [c for c in dict.fromkeys(q.category for q in questions)] + ["overall"]
    names = list(variants)
    print("MAT (tokens per target pass, bonus included) at equal node budgets")
    print(f"{'category':15s}" + "".join(f"{n:>16s}" for n in names))
    for c in cats:
        print(f"{c:15s}" + "".join(f"{mat[(n, c)][0] / max(mat[(n, c)][1], 1):16.3f}" for n in names))


def add_store(trie, keys, nodes, conf_bin) -> None:
    """Merge the datastore's nodes into auto's trie: key ("store"|"storeL", depth, bin of count / parent's count)."""
    where: list[int | None] = []
    for parent, tok, cond, size in nodes:
        par = -1 if parent < 0 else where[parent]
        if par is None and parent >= 0:
            where.append(None)
            continue
        before = len(trie)
        node = trie.add(par, tok)
        where.append(node)
        if node is None:
            continue
        depth = trie.depth[node]
        key = ("storeL" if size >= 3 else "store", min(depth, 4), conf_bin(cond))
        if len(trie) > before:
            keys.append([key])
        elif key not in keys[node]:
            keys[node].append(key)


def accepted(tokens, parents, chosen, future) -> int:
    """The longest root path of chosen nodes whose tokens equal `future` in order."""
    ok = {-1: 0}
    best = 0
    for j, (t, p) in enumerate(zip(tokens, parents)):
        if j in chosen and p in ok and ok[p] < len(future) and t == future[ok[p]]:
            ok[j] = ok[p] + 1
            best = max(best, ok[j])
    return best


if __name__ == "__main__":
    main()
