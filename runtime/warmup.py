"""Load-time warm-up: run every verify shape (first-use allocations stay out of later timings) and time it,
so the adaptive policy starts from measured costs rather than a guess."""

from __future__ import annotations

import time

import numpy as np


def warm_up(target, draft, max_k: int) -> tuple[list[float], float | None, float | None]:
    """Seconds of one target pass over k + 1 tokens (k = 0..max_k), of one draft token and of one draft call over
    max_k + 1 tokens (what a row adds to a draft call: an int4 draft's rows are dear, auto's catch-up prices them),
    each the best of two runs after one untimed run (the warm-up)."""
    ids = np.zeros(max_k + 1, dtype=np.int64)

    def timed(runner, s: int) -> float:
        best = float("inf")
        for rep in range(3):
            runner.reset()
            t0 = time.perf_counter()
            runner.forward(ids[:s])
            if rep:  # the first run only warms up
                best = min(best, time.perf_counter() - t0)
        runner.reset()
        return best

    verify = [timed(target, k + 1) for k in range(max_k + 1)]
    if draft is None:
        return verify, None, None
    timed(draft, 2)  # the draft's catch-up shape, warmed up only
    one = timed(draft, 1)
    return verify, one, (timed(draft, max_k + 1) if max_k > 2 else None)
