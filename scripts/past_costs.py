"""Seconds of a target pass and of a draft call by rows and by past length (issue #51: where a long prompt's time
goes under `auto`), beside what the load-time warm-up (runtime/warmup.py, past 0) gives `auto`'s cost model.

usage: python scripts/past_costs.py BUNDLE [--pasts 800,300,20,0] [--rows 1,2,5,9] [--rounds 7]

Each runner's cache is filled with PASTS[0] rows once per round, then cut back to each past in turn (descending),
where one call over R rows is timed: every (runner, past, rows) shape once per round, interleaved, the first round
only warming up. Prints the median and the best of the rounds, in ms. Token ids are random: attention's cost does
not depend on them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from specrt.runtime import load


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--pasts", default="800,300,20,0")
    ap.add_argument("--rows", default="1,2,5,9")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    pasts = sorted((int(p) for p in a.pasts.split(",")), reverse=True)
    sizes = [int(s) for s in a.rows.split(",")]
    gen = load(a.bundle, backend="ort", threads=1)
    verify, draft1, draft_k = gen._load_costs
    print("load-time (past 0) target ms by rows:", [round(1e3 * s, 1) for s in verify])
    if draft1 is not None:
        print(f"load-time draft ms: 1 row {1e3 * draft1:.1f}, {gen.max_draft_tokens + 1} rows {1e3 * (draft_k or 0):.1f}")
    ids = np.random.default_rng(0).integers(100, gen.vocab_size - 100, size=pasts[0] + max(sizes)).astype(np.int64)
    runners = [("target", gen.target)] + ([("draft", gen.draft)] if gen.draft is not None else [])
    got: dict[tuple[str, int, int], list[float]] = {}
    for rnd in range(a.rounds):
        for name, r in runners:
            r.reset()
            r.prefill(ids[:pasts[0]], 256)
            for past in pasts:
                for s in sizes:
                    r.truncate(past)
                    t0 = time.perf_counter()
                    r.forward(ids[past:past + s])
                    if rnd:
                        got.setdefault((name, past, s), []).append(time.perf_counter() - t0)
                    r.truncate(past)
    for name, _ in runners:
        for past in pasts:
            cells = " ".join(f"S{s} {1e3 * np.median(got[(name, past, s)]):.1f}/{1e3 * min(got[(name, past, s)]):.1f}"
                             for s in sizes)
            print(f"{name:6s} past {past:4d}  median/best ms: {cells}")
    gen.close()


if __name__ == "__main__":
    main()
