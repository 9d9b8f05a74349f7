"""Seeding the successor table (runtime/proposers/recycle_seed.py): answers generated together on the batch engine,
rows recomputed in multi-row passes, give the table a step-by-step greedy decode gives."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.runtime import load
from specrt.runtime.chat_template import chat_prompt_ids
from specrt.runtime.proposers.recycle_seed import seed_table
from specrt.runtime.proposers.recycle_table import SuccessorTable

PROMPTS = ["Why is the sky blue?", "Write a haiku about the ocean.", "What is 17 times 23?"]
NEW = 12


def stepwise_table(gen, prompts) -> SuccessorTable:
    """The reference: decode each answer greedily one token per pass, refreshing the table with every row."""
    table = SuccessorTable(gen.vocab_size)
    target = gen.target
    target.set_argmax_only(False)
    for text in prompts:
        ids = np.array(chat_prompt_ids(gen, text), np.int64)
        target.reset()
        row, fed = target.prefill(ids), ids[-1:]
        for _ in range(NEW):
            table.refresh(fed, row[None, :])
            nxt = int(row.argmax())
            if nxt in gen.eos_ids:
                break
            fed = np.array([nxt], np.int64)
            row = target.forward(fed)[0]
    target.reset()
    return table


@pytest.mark.slow  # ~30 s: a batch engine is started (its cost table measured) on the toy bundle
def test_batched_seeding_gives_the_stepwise_table(target_only_bundle, monkeypatch):
    gen = load(target_only_bundle, threads=1, warmup=False)
    engines = []
    make_engine = gen.engine
    monkeypatch.setattr(gen, "engine", lambda **kw: engines.append(kw) or make_engine(**kw))
    batched = seed_table(gen, PROMPTS, max_new_tokens=NEW, batch=4)
    assert engines == [{"max_batch": 3}]  # the answers came from one batch engine
    single = seed_table(gen, PROMPTS, max_new_tokens=NEW, batch=1)
    reference = stepwise_table(gen, PROMPTS)
    known = reference.succ[:, 0] >= 0
    assert known.sum() > 5
    for table in (batched, single):
        assert ((table.succ[:, 0] >= 0) == known).all()  # the same tokens have rows
        assert (table.succ[known, 0] == reference.succ[known, 0]).all()  # and the same best successor
        assert (table.succ[known] == reference.succ[known]).all(1).mean() > 0.9  # top-8 order: rounding aside
