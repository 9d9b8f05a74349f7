"""What `auto`'s datastore lookup (runtime/proposers/store.py `Datastore.tree`) costs per step, in thread CPU time,
before and after #51's vectorised tree, and whether the two offer the same nodes (issue #51).

usage: python scripts/store_profile.py BUNDLE QUESTIONS.jsonl [--per-category 3] [--max-new-tokens 128]
                                       [--threads 2] [--rounds 3] [--proposer]

One plain and one `auto` greedy run per question's first turn (chat template, as the bench); the auto run's outputs
must equal plain's. Every lookup the auto runs make is recorded (context, depth, budget, EOS ids), then replayed
`--rounds` times through `before` (the lookup as it was: a `match` per suffix length, an `np.unique` and a heap entry
per node; kept below as `before_tree`), `no memo` (`Datastore.tree` less its memo of recent trees) and `now`
(`Datastore.tree`, its memo emptied at the start of each round: as in the runs, which made these lookups in this
order), the order of the three rotating per call, each call timed with `time.thread_time_ns` (this thread's CPU: what
the step pays, steadier on a shared machine than wall time). Every replayed call's nodes must be identical. Prints ms
per lookup (mean / median / p90) and per step for each, and their ratios to `before`.

--proposer: instead, the whole of `auto`'s proposer per step (thread CPU of `AutoProposer.propose` + `observe`: the
candidates of every source, the sizing, the scoring) in three variants run in turn on each question, the order
rotating: `auto[-store]`, `auto` with the lookup as before, `auto` as now: what scripts/auto_modeled.py's
--proposer-ms should be for each.
"""

from __future__ import annotations

import argparse
import heapq
import time

import numpy as np

from specrt.bench.measure import run_once
from specrt.bench.spec_bench import chat_ids, load_questions, pick
from specrt.runtime import load
from specrt.runtime.proposers import auto as auto_mod
from specrt.runtime.proposers import store as store_mod
from specrt.runtime.proposers.store_tree import grow
from specrt.runtime.sampling import SamplingParams

clock = time.thread_time_ns


def before_continuations(store, tokens, n, depth, min_match=1):
    """The lookup's rows as before #51: one `match` (two searchsorted calls) per suffix length tried."""
    for size in range(min(store_mod.MAX_MATCH, n), min_match - 1, -1):
        lo, hi = store.match(tokens[n - size:n])
        if hi > lo:
            pick_ = (np.arange(lo, hi) if hi - lo <= store_mod.MAX_ROWS else
                     np.linspace(lo, hi - 1, store_mod.MAX_ROWS).astype(np.int64))
            pos = store.order[pick_]
            idx = pos[:, None].astype(np.int64) + size + np.arange(depth)
            rows = np.where(idx < store.corpus.size, store.corpus[np.minimum(idx, store.corpus.size - 1)], -1)
            return size, np.where(np.cumsum(rows == -1, axis=1) > 0, -1, rows)
    return 0, np.zeros((0, depth), dtype=np.int32)


def before_tree(store, tokens, n, depth, budget, eos_ids=frozenset(), min_match=1):
    """`Datastore.tree` as before #51: an np.unique and a Python loop per node popped."""
    size, rows = before_continuations(store, tokens, n, depth, min_match)
    if not rows.shape[0] or budget < 1 or depth < 1:
        return []
    total, out, heap, count = rows.shape[0], [], [], 0

    def push_children(parent, members, d):
        nonlocal count
        if d >= depth:
            return
        toks, inv, counts = np.unique(rows[members, d], return_inverse=True, return_counts=True)
        for j, (t, c) in enumerate(zip(toks.tolist(), counts.tolist())):
            if t == -1 or t in eos_ids:
                continue
            heapq.heappush(heap, (-c / total, count, parent, t, c / members.size, members[inv == j], d + 1))
            count += 1

    push_children(-1, np.arange(total), 0)
    while heap and len(out) < budget:
        _, _, parent, t, cond, members, d = heapq.heappop(heap)
        out.append((parent, t, cond, size))
        push_children(len(out) - 1, members, d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("questions")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--proposer", action="store_true", help="time auto's whole proposer per step instead")
    a = ap.parse_args()
    gen = load(a.bundle, backend="ort", threads=a.threads)
    store = store_mod.store_for(gen)
    if store is None:
        raise SystemExit(f"{a.bundle} has no datastore (specrt store)")
    params = SamplingParams(temperature=0.0)
    qs, _ = pick(gen, load_questions(a.questions), a.per_category, a.max_new_tokens)
    if a.proposer:
        return proposer_cost(gen, qs, a.max_new_tokens, a.rounds, params)
    calls, steps, same = [], 0, 0
    tree = store_mod.Datastore.tree

    def recording(self, tokens, n, depth, budget, eos_ids=frozenset(), min_match=1):
        calls.append((np.array(tokens[:n]), n, depth, budget, frozenset(eos_ids), min_match))
        return tree(self, tokens, n, depth, budget, eos_ids, min_match)

    store_mod.Datastore.tree = recording
    for q in qs:
        ids = chat_ids(gen, [{"role": "user", "content": q.turns[0]}])
        plain = run_once(gen, ids, a.max_new_tokens, "none", 0, params).token_ids
        res = run_once(gen, ids, a.max_new_tokens, "auto", "auto", params)
        same += res.token_ids == plain
        steps += len(res.steps)
    store_mod.Datastore.tree = tree
    print(f"{a.bundle}: {len(qs)} questions, auto identical to plain {same}/{len(qs)}; {len(calls)} lookups in "
          f"{steps} steps ({store.corpus.size} corpus tokens); {a.rounds} rounds, thread CPU ms per lookup")
    names = ["before", "no memo", "now"]
    times: dict[str, list[float]] = {name: [] for name in names}

    def no_memo(tokens, n, depth, budget, eos_ids, min_match):  # Datastore.tree less its memo
        size, lo, hi = store.longest(tokens, n, min_match)
        return grow(store._rows(size, lo, hi, depth), budget, size, eos_ids) if size else []

    fns = {"before": lambda *c: before_tree(store, *c), "no memo": no_memo, "now": lambda *c: store.tree(*c)}
    mismatch = 0
    for rnd in range(a.rounds):
        store._memo.clear()
        for i, call in enumerate(calls):
            got = {}
            for j in range(len(names)):
                name = names[(i + rnd + j) % len(names)]
                t0 = clock()
                got[name] = fns[name](*call)
                times[name].append((clock() - t0) / 1e6)
            mismatch += not got["before"] == got["no memo"] == got["now"]
    per_step = len(calls) / max(steps, 1)
    for name, xs in times.items():
        x = np.array(xs)
        print(f"  {name:8s} mean {x.mean():.3f}  median {np.median(x):.3f}  p90 {np.percentile(x, 90):.3f}  "
              f"({x.mean() * per_step:.3f} ms a step)  before / this {np.mean(times['before']) / x.mean():.2f}")
    print(f"  lookups whose nodes differ: {mismatch} of {len(calls) * a.rounds}")


def proposer_cost(gen, qs, max_new_tokens: int, rounds: int, params) -> None:
    P = auto_mod.AutoProposer
    spent = [0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += clock() - t0
        return wrapper

    P.propose, P.observe = timed(P.propose), timed(P.observe)
    now = store_mod.Datastore.tree
    variants = {"auto[-store]": ("auto[-store]", now), "auto, lookup before": ("auto", before_tree),
                "auto, lookup now": ("auto", now)}
    tot = {name: [0, 0, 0] for name in variants}  # thread ns, steps, identical to plain
    for rnd in range(rounds):
        for qi, q in enumerate(qs):
            ids = chat_ids(gen, [{"role": "user", "content": q.turns[0]}])
            plain = run_once(gen, ids, max_new_tokens, "none", 0, params).token_ids
            names = list(variants)
            for j in range(len(names)):
                name = names[(qi + rnd + j) % len(names)]
                label, store_mod.Datastore.tree = variants[name]
                spent[0] = 0
                res = run_once(gen, ids, max_new_tokens, label, "auto", params)
                tot[name][0] += spent[0]
                tot[name][1] += len(res.steps)
                tot[name][2] += res.token_ids == plain
            store_mod.Datastore.tree = now
    print(f"{len(qs)} questions x {rounds} rounds: auto's proposer (propose + observe), thread CPU ms a step")
    for name, (ns, steps, same) in tot.items():
        print(f"  {name:20s} {ns / 1e6 / max(steps, 1):.3f} ms a step over {steps} steps; identical to plain "
              f"{same}/{len(qs) * rounds}")


if __name__ == "__main__":
    main()
