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
