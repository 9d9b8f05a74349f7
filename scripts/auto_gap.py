"""Where `auto`'s MAT goes: a live `auto` run instrumented against the plain greedy future (issue #51).

usage: python scripts/auto_gap.py BUNDLE QUESTIONS.jsonl [--per-category 2] [--max-new-tokens 128] [--threads 2]
                                  [--full] [--json OUT]

Per question (first turn, the bundle's chat template): one plain greedy run (the future each step must match), then
one `auto` run whose proposer is watched. At every step, against the true future:
  chosen   the nodes the pass carried and how many of them the target accepted (the live MAT);
  top8     the 8 candidates of highest predicted path probability (the best 8-node tree by the estimates);
  trie     every candidate (<= 64) the sources offered: the ceiling of the candidate set;
  table / ngram   each source's own candidates alone.
Also the proposer's seconds per step and the pass size per step. `--full` makes every step draft the whole node
budget (flat costs), the live MAT at full budget. Questions: lines {"category": ..., "turns": [...]} (write your own:
never Spec-Bench's, which measure the result).
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import numpy as np

from specrt.bench.measure import run_once
from specrt.bench.spec_bench import chat_ids, load_questions, pick
from specrt.runtime import load
from specrt.runtime.proposers import auto as auto_mod
from specrt.runtime.sampling import SamplingParams


def match(tokens, parents, nodes, future) -> int:
    """Longest root path among `nodes` (indices into tokens/parents, prefix-closed or not) matching `future`."""
    keep = set(nodes)
    ok = {-1: 0}
    best = 0
    for i in range(len(tokens)):  # topological
        p = parents[i]
        if i in keep and p in ok and ok[p] < len(future) and tokens[i] == future[ok[p]]:
            ok[i] = ok[p] + 1
            best = max(best, ok[i])
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("questions")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    gen = load(a.bundle, backend="ort", threads=a.threads)
    params = SamplingParams(temperature=0.0)
    qs, _ = pick(gen, load_questions(a.questions), a.per_category, a.max_new_tokens)
    log: list[dict] = []
    ctx = {"future": None, "prompt": 0}
    orig_propose, orig_observe = auto_mod.AutoProposer.propose, auto_mod.AutoProposer.observe

    def propose(self, tokens, n, k):
        t0 = time.perf_counter()
        if a.full:
            self.state.costs.table = lambda: [1.0] * (k + 2)
        prop = orig_propose(self, tokens, n, k)
        dt = time.perf_counter() - t0
        cand_tokens, parents, keys = self._cand
        fut = ctx["future"][n - ctx["prompt"]:][:12]
        stats = self.state.stats
        probs = auto_mod.path_probs(parents, [max(stats.prob(key) for key in ks) for ks in keys])
        top8 = sorted(range(len(probs)), key=lambda i: (-probs[i], i))[:8]
        src = lambda s: [i for i, ks in enumerate(keys) if any(kk[0].startswith(s) for kk in ks)]
        log.append({"cat": ctx["cat"], "n": n, "k": k, "nodes": int(prop.token_ids.size), "cands": len(cand_tokens),
                    "top8": match(cand_tokens, parents, top8, fut),
                    "trie": match(cand_tokens, parents, range(len(cand_tokens)), fut),
                    "table": match(cand_tokens, parents, src("table"), fut),
                    "ngram": match(cand_tokens, parents, src("ngram"), fut),
                    "pred": float(sum(sorted(probs, reverse=True)[:prop.token_ids.size])),
                    "s": dt, "fut": list(map(int, fut)), "cand": list(map(int, cand_tokens)),
                    "par": list(map(int, parents)), "keys": [[list(kk) for kk in ks] for ks in keys],
                    "probs": [float(x) for x in probs]})
        return prop

    def observe(self, n, num_accepted, target_hidden=None):
        if log and "acc" not in log[-1]:
            log[-1]["acc"] = num_accepted
        return orig_observe(self, n, num_accepted, target_hidden)

    auto_mod.AutoProposer.propose, auto_mod.AutoProposer.observe = propose, observe
    warm = chat_ids(gen, [{"role": "user", "content": "Tell me about the history of the bicycle."}])
    run_once(gen, warm, a.max_new_tokens, "none", 0, params)
    ctx.update(future=run_once(gen, warm, a.max_new_tokens, "none", 0, params).token_ids, prompt=warm.size, cat="warm")
    run_once(gen, warm, a.max_new_tokens, "auto", "auto", params)
    log.clear()
    runs = []
    for q in qs:
        ids = chat_ids(gen, [{"role": "user", "content": q.turns[0]}])
        plain = run_once(gen, ids, a.max_new_tokens, "none", 0, params)
        ctx.update(future=plain.token_ids, prompt=ids.size, cat=q.category)
        res = run_once(gen, ids, a.max_new_tokens, "auto", "auto", params)
        runs.append({"cat": q.category, "identical": res.token_ids == plain.token_ids,
                     "mat": 1 + res.stats.accepted_tokens / max(res.stats.verify_steps, 1),
                     "tps": (res.stats.new_tokens - 1) / max(res.stats.elapsed_s - res.stats.prefill_seconds, 1e-9),
                     "plain_tps": (plain.stats.new_tokens - 1) / max(plain.stats.elapsed_s -
                                                                      plain.stats.prefill_seconds, 1e-9)})
    by = collections.defaultdict(list)
    for r in log:
        by[r["cat"]].append(r)
    print(f"{'category':15s} steps  MAT  sp   nodes plain% | per-step accepted if drafted: top8 trie table ngram |"
          " proposer ms")
    for cat, rs in list(by.items()) + [("all", log)]:
        rr = [r for r in runs if cat in ("all", r["cat"])]
        acc = np.mean([r.get("acc", 0) for r in rs])
        print(f"{cat:15s} {len(rs):5d} {np.mean([r['mat'] for r in rr]):4.2f} "
              f"{np.mean([r['tps'] / r['plain_tps'] for r in rr]):4.2f} {np.mean([r['nodes'] for r in rs]):5.2f} "
              f"{100 * np.mean([r['nodes'] == 0 for r in rs]):5.1f} | acc {acc:4.2f}  "
              f"{np.mean([r['top8'] for r in rs]):4.2f} {np.mean([r['trie'] for r in rs]):4.2f} "
              f"{np.mean([r['table'] for r in rs]):4.2f} {np.mean([r['ngram'] for r in rs]):4.2f} | "
              f"{1e3 * np.mean([r['s'] for r in rs]):6.2f}")
    print("identical:", sum(r["identical"] for r in runs), "/", len(runs))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "steps": log}, f)


if __name__ == "__main__":
    main()
