"""`auto`'s goodput modeled without timing noise (issue #51): a load-independent way to compare sizing changes.

usage: python scripts/auto_modeled.py BUNDLE QUESTIONS.jsonl fp32|int4|self [--methods ngram,auto]
                                      [--proposer-ms 0.8] [--ngram-ms 0.1] [--row-costs benchmarks/spec_bench_row_costs.json]

Every pass is priced at the quiet machine's T(S) recorded in BENCHMARKS.md's Spec-Bench section
(benchmarks/spec_bench_row_costs.json, by bundle kind) instead of the clock, and `auto`'s cost model is fed those
same figures, so a run gives the same trees on a busy machine as on an idle one; the proposers' own time is a
constant per step (thread CPU time measured on SmolLM2 int4: ~0.8 ms for `auto`'s tree, ~0.1 ms for prompt lookup).
Prints per category: modeled speedup over plain (plain steps x T(1) over the method's sum of T(S) + proposer time),
MAT and rows per pass. Outputs are checked identical to plain. Each method starts from its own copy of the
successor table and of `auto`'s state (one method's answers never teach another's table). Questions: lines
{"category": ..., "turns": [...]} written for tuning (benchmarks/prompts/tune_questions.jsonl), never Spec-Bench's.
"""

from __future__ import annotations

import argparse
import collections
import json

from specrt.bench.spec_bench import chat_ids, load_questions, pick
from specrt.runtime import load
from specrt.runtime.policy import AdaptiveK
from specrt.runtime.proposers import auto
from specrt.runtime.proposers.auto_policy import SizingPolicy
from specrt.runtime.proposers.recycle_table import table_for


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("questions")
    ap.add_argument("kind", choices=("fp32", "int4", "self"))
    ap.add_argument("--methods", default="ngram,auto")
    ap.add_argument("--proposer-ms", type=float, default=0.8)
    ap.add_argument("--ngram-ms", type=float, default=0.1)
    ap.add_argument("--row-costs", default="benchmarks/spec_bench_row_costs.json")
    a = ap.parse_args()
    methods = a.methods.split(",")
    gen = load(a.bundle, backend="ort", threads=1, warmup=False)
    k = gen.max_draft_tokens
    t = json.load(open(a.row_costs))[a.kind]["seconds"]
    t = (t + [t[-1]] * k)[:k + 1]
    gen._load_costs = (list(t), None)
    over = {m: (a.proposer_ms if m == "auto" else a.ngram_ms) / 1e3 for m in methods}

    class Sizing(SizingPolicy):
        def update(self, k_, drafted, accepted, draft_s, verify_s):
            self.state.costs.observe(drafted + 1, t[drafted], over["auto"])

    class Modeled(AdaptiveK):
        def update(self, k_, drafted, accepted, draft_s, verify_s):
            super().update(k_, drafted, accepted, 1e-5 * drafted, t[drafted])

    policies, states = {}, {}
    table = table_for(gen)
    tables = {m: (table.succ.copy(), table.conf.copy()) for m in methods}
    for m in methods:
        if m == "auto":
            auto._STATES.pop(gen, None)
            states[m] = auto.state_for(gen)
        else:
            policies[m] = Modeled(k)
            policies[m].prime(list(t), 0.0)
    agg = collections.defaultdict(lambda: [0.0, 0, 0, 0])  # seconds, steps, tokens, rows
    questions, _ = pick(gen, load_questions(a.questions), 99, 128)
    for q in questions:
        ids = chat_ids(gen, [{"role": "user", "content": q.turns[0]}])
        plain = gen.generate(ids, 128, method="none", temperature=0)
        n = len(plain.token_ids) - 1
        for c in (q.category, "overall"):
            agg[("plain", c)][0] += t[0] * n
        for m in methods:
            table.succ[:], table.conf[:] = tables[m]
            if m == "auto":
                auto._STATES[gen] = states[m]
            steps = []
            policy = Sizing(states[m], k) if m == "auto" else policies[m]
            res = gen.generate(ids, 128, method=m, temperature=0, policy=policy,
                               on_step=lambda k_, d, acc: steps.append(d))
            tables[m] = (table.succ.copy(), table.conf.copy())
            if res.token_ids != plain.token_ids:
                raise SystemExit(f"{m}: output differs from plain on {q.turns[0][:40]!r}")
            for c in (q.category, "overall"):
                row = agg[(m, c)]
                row[0] += sum(t[d] for d in steps) + over[m] * len(steps)
                row[1] += len(steps)
                row[2] += n
                row[3] += sum(d + 1 for d in steps)
    for c in sorted({c for _, c in agg}):
        cells = []
        for m in methods:
            s, steps, n, rows = agg[(m, c)]
            cells.append(f"{m} {agg[('plain', c)][0] / s:.3f}x MAT {n / steps:.2f} S {rows / steps:.2f}")
        print(f"{c:15s} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
