"""A draft head as one source of `auto`'s tree (#52, runtime/proposers/head_source.py).

An oracle fused head (the construction of tests/runtime/test_draft_head.py: a one-layer Llama target whose attention
output is zero, so its next token depends only on the current one; a head whose fc reads only the embedding of
token t + 1, with the target's layer, norm and full vocabulary) drafts exactly the target's next tokens: through
auto, every head node on the committed path is accepted, and its running estimates stay high. A random head
is drafted at first and then no more: its estimates decay (tests/runtime/test_fused_head.py).
"""

from __future__ import annotations

import pytest
import torch

PROMPTS = ("def main(argv):\n    ", "import os\nimport json\n\n\nclass Config:\n")


@pytest.fixture(scope="module")
def oracle_fused(workdir, tokenizer_path):
    from helpers import oracle_head_target
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.models.draft_head_fused import FusedDraftHead, save_fused_head
    from specrt.runtime import load

    base = workdir / "oracle_fused"
    target, decoder = oracle_head_target(base / "target", tokenizer_path)
    head = FusedDraftHead(decoder, torch.arange(decoder.config.vocab_size), (0,))
    d = decoder.config.hidden_size
    with torch.no_grad():  # [0 | I | 0]: the embedding of token t + 1 only
        head.fc.weight.zero_()
        head.fc.weight[:, d:2 * d].copy_(torch.eye(d))
    save_fused_head(head, base / "head")
    bundle = compile_bundle(CompileSpec(target, base / "bundle", f"head:{base / 'head'}", max_seq_len=128,
                                        max_draft_tokens=6))
    gen = load(bundle, backend="ort")
    yield gen
    gen.close()


def test_auto_drafts_an_oracle_head_and_keeps_it(oracle_fused):
    from specrt.runtime.proposers.auto import state_for

    from specrt.runtime.tree_budget import fixed_costs

    gen = oracle_fused
    # seeded sampling's fixed pass costs: whether the head pays depends on its estimates, not on this machine's load
    state_for(gen).costs = fixed_costs(gen.max_draft_tokens + 1)
    for prompt in PROMPTS:
        plain = gen.generate(prompt, 40, method="none")
        spec = gen.generate(prompt, 40, method="auto")
        assert spec.token_ids == plain.token_ids
        assert spec.stats.draft_calls > 0  # head calls (the bundle has no draft model)
    stats = state_for(gen).stats
    assert stats.prob(("head", 1, 0)) > 0.8 and stats.prob(("head", 2, 0)) > 0.8  # the prior: 0.4, 0.5
    # the head's chain carries the steps: several tokens per pass
    assert spec.stats.accepted_tokens > 0.5 * len(spec.token_ids)


def test_auto_without_the_head_never_drafts_it(oracle_fused):
    """auto_sources (runtime/proposers/auto_sources.py): `-head` leaves the head out (no head call, no head node),
    `head` alone drafts from it only; greedy output stays plain's; the default still has it."""
    import numpy as np

    from specrt.runtime.proposers.auto import state_for
    from specrt.runtime.proposers.head_source import HeadSource
    from specrt.runtime.tree_budget import fixed_costs

    gen = oracle_fused
    state_for(gen).costs = fixed_costs(gen.max_draft_tokens + 1)  # whether the head pays: its estimates, not load
    assert "head" in gen.request("generate", auto_sources="head").auto_sources
    for prompt in PROMPTS:
        plain = gen.generate(prompt, 30, method="none").token_ids
        without = gen.generate(prompt, 30, auto_sources="-head")
        assert without.token_ids == plain and without.stats.draft_calls == 0  # no head call
        only = gen.generate(prompt, 30, auto_sources="head")
        assert only.token_ids == plain and only.stats.draft_calls > 0
        assert gen.generate(prompt, 30).stats.draft_calls > 0  # the default: every source, the head included
    req = gen.request("generate", auto_sources="-head")
    proposer = gen.make_proposer("auto", req.sampling, np.random.default_rng(0), {}, req.auto_sources)
    assert proposer.head is None and proposer.sources == {"ngram", "recycle"}
    req = gen.request("generate", auto_sources="head")
    proposer = gen.make_proposer("auto", req.sampling, np.random.default_rng(0), {}, req.auto_sources)
    assert isinstance(proposer.head, HeadSource) and not proposer.sources
    ids = gen.encode_prompt(PROMPTS[1])
    tokens = np.zeros(gen.max_seq_len, np.int64)
    tokens[:ids.size] = ids
    _, keys = proposer.candidates(tokens, int(ids.size), 4)
    assert keys == []  # neither n-gram nor table candidates: the head's are added when it runs (propose)


def test_the_bench_compares_auto_with_and_without_the_head(oracle_fused):
    """One interleaved Spec-Bench run with labels: rows `auto[-head]` and `auto`, outputs identical, head calls only
    in `auto`'s runs."""
    from specrt.bench.spec_bench import Question, run_spec_bench
    from specrt.runtime.proposers.auto import state_for
    from specrt.runtime.tree_budget import fixed_costs

    gen = oracle_fused
    state_for(gen).costs = fixed_costs(gen.max_draft_tokens + 1)
    questions = [Question("qa", ("def main(argv):",)), Question("mt_bench", ("import os", "and json?"))]
    result = run_spec_bench(gen, ["ngram", "auto[-head]", "auto"], questions, 12, warm_up=False)
    labels = {(r["method"], r["category"]) for r in result["rows"]}
    assert labels == {(m, c) for m in ("ngram", "auto[-head]", "auto") for c in ("qa", "mt_bench", "overall")}
    assert all(r["identical"] for r in result["runs"])
    assert result["methods"] == ["ngram", "auto[-head]", "auto"]


def test_batched_auto_refuses_the_head_alone(oracle_fused):
    """Under batching auto drafts from ngram and recycle only: a request for the head alone is refused there."""
    from specrt.core.errors import InvalidArgument

    with oracle_fused.engine(max_batch=2) as eng:
        with pytest.raises(InvalidArgument, match="under batching auto drafts from ngram and recycle only"):
            eng.submit("def main(argv):", max_new_tokens=4, auto_sources="head")
