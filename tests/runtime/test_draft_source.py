"""A draft model as a source of `auto`'s tree (runtime/proposers/draft_source.py): the catch-up call after steps
without the draft (the prompt, on its first call) is priced by what a row costs that draft, timed at load and then
learned from its own catch-up calls; an int4 draft's dear rows keep it from paying a long catch-up that a cheap-row
draft would pay, and it drafts again once it is caught up. Real toy runners (the target as its own draft)."""

from __future__ import annotations

import numpy as np

from specrt.runtime.proposers import draft_source
from specrt.runtime.proposers.auto import PRIORS
from specrt.runtime.proposers.draft_source import ROW_ALPHA, ROW_FRAC, DraftSource
from specrt.runtime.proposers.token_tree import DraftTrie
from specrt.runtime.tree_budget import NodeStats

COSTS = [0.02 * (1 + 0.05 * s) for s in range(9)]  # fp32-like T(S): 20 ms a one-row target pass
ONE_ROW = 0.004  # a draft call: 0.2 of the target's


def steady_stats(p: float) -> NodeStats:
    """Estimates after many steps where the draft's chain was accepted with probability ~p at every depth."""
    stats = NodeStats(PRIORS)
    for i in range(60):
        for d in range(1, 9):
            stats.trial(NodeStats.key("draft", d, 0), (i * p) % 1.0 + p >= 1.0)
    return stats


def source_at(gen, n: int, fed: int, row_frac: float) -> tuple[DraftSource, np.ndarray]:
    tokens = (np.arange(200, dtype=np.int64) * 7) % gen.vocab_size + 3
    src = DraftSource(gen.draft, gen.vocab_size, cost_s=ONE_ROW, row_frac=row_frac)
    src.start(tokens, n)  # the cache is empty: the first call feeds the whole prompt
    if fed:
        gen.draft.prefill(tokens[:fed])
    return src, tokens


def test_dear_rows_keep_a_long_catch_up_out_and_a_caught_up_draft_in(self_generator):
    gen, n = self_generator, 60
    stats = steady_stats(0.7)
    depth = {}
    for label, frac, fed in (("cheap rows", ROW_FRAC, 0), ("int4 rows", 0.25, 0), ("int4, caught up", 0.25, n - 1)):
        src, _ = source_at(gen, n, fed, frac)
        depth[label] = src.depth(stats, n, [], [], COSTS, 8, 0.0, False)
    # 59 unseen rows: 1 + 58/32 = 2.8 one-row calls with cheap rows (pays), 15.5 at 0.25 a row (does not)
    assert depth["cheap rows"] > 0 and depth["int4 rows"] == 0 and depth["int4, caught up"] > 0, depth


def test_catch_up_calls_teach_what_a_row_costs(self_generator, monkeypatch):
    """Each call priced at ONE_ROW x (1 + 0.25 per row past two) on a clock the calls advance: a catch-up of 59 rows
    moves `row_frac` towards 0.25 by ROW_ALPHA, and the one-row calls after it keep the one-row cost."""
    gen, n = self_generator, 60

    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

    clock = Clock()
    monkeypatch.setattr(draft_source, "time", clock)
    for name in ("forward", "forward_last"):
        real = getattr(gen.draft, name)

        def priced(ids, *args, _real=real, **kw):
            clock.now += ONE_ROW * (1 + 0.25 * max(np.asarray(ids).size - 2, 0))
            return _real(ids, *args, **kw)
        monkeypatch.setattr(gen.draft, name, priced)
    src, tokens = source_at(gen, n, 0, ROW_FRAC)
    calls = src.extend(DraftTrie(64, 8), [], tokens, n, 3)
    assert calls == 3  # the catch-up (one chunk) and two one-row calls
    assert abs(src.row_frac - ((1 - ROW_ALPHA) * ROW_FRAC + ROW_ALPHA * 0.25)) < 1e-9
    assert abs(src.cost_s - ONE_ROW) < 1e-12
    assert abs(src.call_cost(59) - (1 + src.row_frac * 57)) < 1e-12


def test_auto_starts_from_the_load_time_price_of_a_row(self_generator):
    """warmup() times a (k+1)-row draft call beside the one-row one; `auto`'s draft source starts from their ratio."""
    gen = self_generator
    verify, one, rows = gen._load_costs
    assert len(verify) == gen.max_draft_tokens + 1 and one > 0 and rows > 0
    proposer = gen.make_proposer("auto", gen.request().sampling, np.random.default_rng(0), {})
    expected = (rows / one - 1) / (gen.max_draft_tokens - 1)
    assert abs(proposer.draft.row_frac - min(max(expected, 0.0), 1.0)) < 1e-9
    assert proposer.draft.cost_s == one
