"""`auto`'s goodput modeled without timing noise (issue #51): a load-independent way to compare sizing changes.

usage: python scripts/auto_modeled.py BUNDLE QUESTIONS.jsonl fp32|int4|self [--methods ngram,auto]
                                      [--proposer-ms 0.8] [--ngram-ms 0.1] [--row-costs benchmarks/spec_bench_row_costs.json]
                                      [--draft-rows benchmarks/self_draft_rows.json]

Every pass is priced at the quiet machine's T(S) recorded in BENCHMARKS.md's Spec-Bench section
(benchmarks/spec_bench_row_costs.json, by bundle kind) instead of the clock, and `auto`'s cost model is fed those
same figures, so a run gives the same trees on a busy machine as on an idle one; the proposers' own time is a
constant per step (thread CPU time measured on SmolLM2 int4: ~0.8 ms for `auto`'s tree, ~0.1 ms for prompt lookup).
A draft model's calls (`self`: the target's int4 copy; methods draft, hybrid and auto's draft source) are priced too:
a call over R rows at draft_over_target x T(1) (the recorded load-time ratio) x the draft's R-row / 1-row ratio
(--draft-rows: int4's recorded curve to 9 rows, then measured to 256 rows), counted in the step that makes it, as the
bench counts decoding: the draft's prompt prefill in `draft` / `hybrid`'s start() is prefill, excluded like the
target's; `auto`'s lazy catch-up is decoding. `auto` learns these modeled seconds (its clock reads them), not the
wall clock. Before this (stop 57) no draft call was priced and `auto` on `self` never drafted (no load-time draft cost).
Prints per category: modeled speedup over plain (plain steps x T(1) over the method's sum of T(S) + proposer time
+ draft calls), MAT and rows per pass (with a draft model: the share of the modeled seconds its calls took). Outputs
are checked identical to plain. Each method starts from its own copy of the successor table and of `auto`'s state
(one method's answers never teach another's table). Questions: lines {"category": ..., "turns": [...]} written for
tuning (benchmarks/prompts/tune_questions.jsonl), never Spec-Bench's.
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np

from specrt.bench.spec_bench import chat_ids, load_questions, pick
from specrt.runtime import load
from specrt.runtime.policy import AdaptiveK
from specrt.runtime.proposers import auto, draft_source
from specrt.runtime.proposers.auto_policy import SizingPolicy
from specrt.runtime.proposers.recycle_table import table_for


class DraftMeter:
    """Prices the draft runner's calls (R rows: one_row_s x ratio(R)) instead of timing them, and is the clock of
    `auto` and its draft source (perf_counter reads the modeled seconds so far); `step_s` holds this step's."""

    def __init__(self, runner, one_row_s: float, rows: list[int], ratio: list[float]) -> None:
        self.one_row_s, self.rows, self.ratio = one_row_s, rows, ratio
        self.total = self.step_s = 0.0
        for name in ("forward", "forward_last"):
            setattr(runner, name, self._priced(getattr(runner, name)))

    def price(self, r: int) -> float:
        rows, ratio = self.rows, self.ratio
        if r > rows[-1]:  # past the last measured size: its slope per row
            return self.one_row_s * (ratio[-1] + (r - rows[-1]) * (ratio[-1] - ratio[-2]) / (rows[-1] - rows[-2]))
        return self.one_row_s * float(np.interp(r, rows, ratio))

    def _priced(self, call):
        def run(token_ids, *args, **kw):
            s = self.price(int(np.asarray(token_ids).size))
            self.total += s
            self.step_s += s
            return call(token_ids, *args, **kw)
        return run

    def perf_counter(self) -> float:
        return self.total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("questions")
    ap.add_argument("kind", choices=("fp32", "int4", "self"))
    ap.add_argument("--methods", default="ngram,auto")
    ap.add_argument("--proposer-ms", type=float, default=0.8)
    ap.add_argument("--ngram-ms", type=float, default=0.1)
    ap.add_argument("--row-costs", default="benchmarks/spec_bench_row_costs.json")
    ap.add_argument("--draft-rows", default="benchmarks/self_draft_rows.json")
    a = ap.parse_args()
    methods = a.methods.split(",")
    gen = load(a.bundle, backend="ort", threads=1, warmup=False)
    k = gen.max_draft_tokens
    costs = json.load(open(a.row_costs))[a.kind]
    t = costs["seconds"]
    t = (t + [t[-1]] * k)[:k + 1]
    meter, d1 = None, None
    if gen.draft is not None:
        d1 = float(costs["draft_over_target"]) * t[0]
        curve = json.load(open(a.draft_rows))
        meter = DraftMeter(gen.draft, d1, curve["rows"], curve["ratio"])
        draft_source.time = auto.time = meter  # auto and its draft source learn modeled seconds
    gen._load_costs = (list(t), d1, meter.price(k + 1) if meter is not None else None)  # as warmup() times them
    over = {m: (a.proposer_ms if m == "auto" else a.ngram_ms) / 1e3 for m in methods}
    step_draft = []  # modeled draft seconds of each step (next_k starts a step: a start()'s prefill is not in it)

    def begin():
        if meter is not None:
            meter.step_s = 0.0

    def spent() -> float:
        s = meter.step_s if meter is not None else 0.0
        step_draft.append(s)
        return s

    class Sizing(SizingPolicy):
        def next_k(self):
            begin()
            return super().next_k()

        def update(self, k_, drafted, accepted, draft_s, verify_s):
            spent()
            self.state.costs.observe(drafted + 1, t[drafted], over["auto"])

    class Modeled(AdaptiveK):
        def next_k(self):
            begin()
            return super().next_k()

        def update(self, k_, drafted, accepted, draft_s, verify_s):
            s = spent()  # as the loop does: a long catch-up's cost beyond one call is not per drafted token
            super().update(k_, drafted, accepted, min(s, d1 * drafted) if d1 else 1e-5 * drafted, t[drafted])

    policies, states = {}, {}
    table = table_for(gen)
    tables = {m: (table.succ.copy(), table.conf.copy()) for m in methods}
    for m in methods:
        if m == "auto":
            auto._STATES.pop(gen, None)
            states[m] = auto.state_for(gen)
        else:
            policies[m] = Modeled(k)
            policies[m].prime(list(t), d1 if m in ("draft", "hybrid") else 0.0)
    agg = collections.defaultdict(lambda: [0.0, 0, 0, 0, 0.0])  # seconds, steps, tokens, rows, draft seconds
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
            step_draft.clear()
            policy = Sizing(states[m], k) if m == "auto" else policies[m]
            res = gen.generate(ids, 128, method=m, temperature=0, policy=policy,
                               on_step=lambda k_, d, acc: steps.append(d))
            tables[m] = (table.succ.copy(), table.conf.copy())
            if res.token_ids != plain.token_ids:
                raise SystemExit(f"{m}: output differs from plain on {q.turns[0][:40]!r}")
            for c in (q.category, "overall"):
                row = agg[(m, c)]
                row[0] += sum(t[d] for d in steps) + over[m] * len(steps) + sum(step_draft)
                row[1] += len(steps)
                row[2] += n
                row[3] += sum(d + 1 for d in steps)
                row[4] += sum(step_draft)
    for c in sorted({c for _, c in agg}):
        cells = []
        for m in methods:
            s, steps, n, rows, drafting = agg[(m, c)]
            share = f" draft {100 * drafting / s:.0f}%" if meter is not None else ""  # of the modeled seconds
            cells.append(f"{m} {agg[('plain', c)][0] / s:.3f}x MAT {n / steps:.2f} S {rows / steps:.2f}{share}")
        print(f"{c:15s} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
