"""Where `auto`'s per-step proposer time goes, in thread CPU time (issue #51).

usage: python scripts/refresh_profile.py BUNDLE QUESTIONS.jsonl [--per-category 1] [--max-new-tokens 96]
                                         [--threads 2] [--rounds 2]

Runs `auto` (greedy) on the questions' first turns, timing with `time.thread_time_ns` (this thread's CPU time: what
the step pays, less noisy than wall time on a shared machine), and reports per verify step: propose, observe, the
table's refresh (`observe_verify`), the acceptance rule (greedy argmax), and the target pass (wall). Each variant of the
refresh (before: the arithmetic before #51's rework, stage by stage; now: `SuccessorTable.refresh`) runs in turn on
each question (interleaved, the order alternating), so their ratios compare under the same load.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from specrt.bench.measure import run_once
from specrt.bench.spec_bench import chat_ids, load_questions, pick
from specrt.runtime import load, loop, step
from specrt.runtime.proposers import auto as auto_mod
from specrt.runtime.proposers import recycle_table as rt
from specrt.runtime.sampling import SamplingParams

T: dict[str, list[float]] = collections.defaultdict(list)
clock = time.thread_time_ns


def staged_refresh(self, fed_ids, logits):
    """The refresh before #51's rework (take_along_axis gathers, a Python loop of row stores), each stage timed."""
    t0 = clock()
    fed_ids = np.asarray(fed_ids, dtype=np.int64).reshape(-1)
    v, k = min(logits.shape[1], self.vocab_size), self.top_k
    rows = logits[:, :v]
    s = rows.shape[0]
    g = v // rt.GROUP
    gmax = rows.reshape(s, rt.GROUP, g).max(axis=1)
    t1 = clock()
    groups = np.argpartition(gmax, g - k, axis=1)[:, g - k:]
    cols = (groups[:, :, None] + g * np.arange(rt.GROUP)).reshape(s, -1)
    cand = np.take_along_axis(rows, cols, axis=1)
    top = np.take_along_axis(cols, np.argpartition(cand, cand.shape[1] - k, axis=1)[:, -k:], axis=1)
    t2 = clock()
    vals = np.take_along_axis(rows, top, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    top = np.take_along_axis(top, order, axis=1).astype(np.int32)
    vals = np.take_along_axis(vals, order, axis=1)
    finite = np.isfinite(vals)
    with np.errstate(invalid="ignore", over="ignore"):
        z = np.exp(vals - vals[:, :1])
        conf = (z / z.sum(axis=1, keepdims=True)).astype(np.float16)
    t3 = clock()
    with self.lock:
        for i, tok in enumerate(fed_ids.tolist()):
            if not 0 <= tok < self.vocab_size:
                continue
            if finite[i].all():
                self.succ[tok] = top[i]
                self.conf[tok] = conf[i]
            else:
                self._front(tok, top[i][finite[i]])
    t4 = clock()
    for name, a, b in (("r.gmax", t0, t1), ("r.select", t1, t2), ("r.sort+softmax", t2, t3), ("r.write", t3, t4)):
        T[name].append((b - a) / 1e6)


def timed(name, fn):
    def wrapper(*args, **kwargs):
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            T[name].append((clock() - t0) / 1e6)
    return wrapper


def wall(name, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            T[name].append((time.perf_counter() - t0) * 1e3)
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("questions")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    gen = load(a.bundle, backend="ort", threads=a.threads)
    params = SamplingParams(temperature=0.0)
    qs, _ = pick(gen, load_questions(a.questions), a.per_category, a.max_new_tokens)
    variants = {"before": staged_refresh, "now": rt.SuccessorTable.refresh}
    P = auto_mod.AutoProposer
    P.propose, P.observe = timed("propose", P.propose), timed("observe", P.observe)
    ov = timed("observe_verify", P.observe_verify)

    def observe_verify(self, fed_ids, logits, parents=None):
        T["rows"].append(float(fed_ids.size))
        return ov(self, fed_ids, logits, parents)

    P.observe_verify = observe_verify
    loop.accept = timed("accept", step.accept)
    runner = gen.target
    runner.forward = wall("target pass (wall)", runner.forward)
    ids0 = chat_ids(gen, [{"role": "user", "content": "Tell me about the history of the bicycle."}])
    run_once(gen, ids0, a.max_new_tokens, "auto", "auto", params)
    plain: dict[int, list[int]] = {}
    results: dict[str, dict[str, list[float]]] = {v: collections.defaultdict(list) for v in variants}
    same = collections.Counter()
    for rnd in range(a.rounds):
        for qi, q in enumerate(qs):
            ids = chat_ids(gen, [{"role": "user", "content": q.turns[0]}])
            if qi not in plain:
                plain[qi] = run_once(gen, ids, a.max_new_tokens, "none", 0, params).token_ids
            order = list(variants.items())  # the table and auto's estimates persist per bundle: whoever runs second
            if (qi + rnd) % 2:  # on a question finds them taught by the first, so the order alternates
                order.reverse()
            for name, fn in order:
                rt.SuccessorTable.refresh = fn
                T.clear()
                res = run_once(gen, ids, a.max_new_tokens, "auto", "auto", params)
                same[name] += res.token_ids == plain[qi]
                for key, xs in T.items():
                    results[name][key].extend(xs)
    print(f"{a.bundle}: {len(qs)} questions x {a.rounds}"
          f" rounds, ms per call (mean / median), thread CPU unless marked wall")
    for name, res in results.items():
        steps = len(res.get("observe_verify", [])) or 1
        rows = sum(res.get("rows", [])) or 1
        per_row = 1e3 * (sum(res["observe_verify"]) + sum(res["accept"])) / rows
        print(f"-- {name}: {steps} verify steps ({rows / steps:.2f} rows each), identical to plain "
              f"{same[name]}/{len(qs) * a.rounds}; refresh + accept {per_row:.1f} us a row")
        for key in sorted(set(res) - {"rows"}):
            xs = np.array(res[key])
            print(f"   {key:22s} n={xs.size:5d} mean {xs.mean():7.3f}  median {np.median(xs):7.3f}  "
                  f"per step {xs.sum() / steps:7.3f}")


if __name__ == "__main__":
    main()
