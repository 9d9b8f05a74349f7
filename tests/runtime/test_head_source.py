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


# ------------------------------------------------------------------ a head that sits out keeps a bounded queue
class _Cache:
    """Stands in for a head runner's cache length (FeatureQueue only truncates it)."""

    def __init__(self) -> None:
        self.length = 0

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


def test_feature_queue_keeps_the_newest_window_and_restarts_the_cache_there():
    import numpy as np

    from specrt.runtime.proposers.head_features import FeatureQueue

    q, cache, f = FeatureQueue(window=8), _Cache(), 5
    rows = lambda a, b: np.arange(a, b, dtype=np.float32)[:, None].repeat(f, 1)  # row value = its position
    q.start(rows(2, 6), 7)  # prompt of 6 + the first token: features of positions 2 .. 5
    feats, first = q.take(cache)
    assert first == 2 and feats[:, 0].tolist() == [2, 3, 4, 5]
    cache.length = 4 + 3  # 4 committed rows fed, 3 draft rows
    n = 7
    for step in range(500):  # the head sits out 500 steps of 1 to 4 committed tokens
        m = n + 1 + step % 4
        q.add(m, rows(n - 1, m - 1 + 3))  # the verify pass's rows from position n - 1 (3 rejected rows past them)
        n = m
        assert q.queued <= 8 and q.nbytes <= 2 * 8 * f * 4
    feats, first = q.take(cache)
    assert cache.length == 0  # rows were dropped: the head's cache restarts at the first row kept
    assert first == n - 1 - 8 and feats[:, 0].tolist() == list(range(n - 9, n - 1))  # the newest 8, in order
    q.add(n + 2, rows(n - 1, n + 4))
    cache.length = 8 + 2  # + draft rows
    feats, first = q.take(cache)
    assert cache.length == 8 and first == n - 1 and feats[:, 0].tolist() == [n - 1, n]  # no restart: the 8 kept


def _head_chains(monkeypatch, sit_out: int):
    """Patches auto's head source to sit out while fewer than `sit_out` tokens are committed past the prompt, then
    to draft 3 deep; returns (its chains drafted: (tokens, n, chain) each, the queue sizes after every observe)."""
    from specrt.runtime.proposers import head_features, head_source

    monkeypatch.setattr(head_features, "WINDOW", 8)
    chains, sizes = [], []
    extend, observe = head_source.HeadSource.extend, head_source.HeadSource.observe

    def depth(self, *args):
        return 3 if self.features.n >= self.prompt_n + sit_out else 0

    def start(self, tokens, n, target_hidden=None):
        self.prompt_n = n
        head_source.DraftSource.start  # noqa: B018 - (the base's start resets a draft runner; not the head's)
        orig_start(self, tokens, n, target_hidden)

    def spy_extend(self, trie, keys, tokens, n, d):
        calls = extend(self, trie, keys, tokens, n, d)
        chain = sorted((k[1], trie.tokens[i]) for i, ks in enumerate(keys) for k in ks if k[0] == "head" and k[2] == 0)
        chains.append((tokens, n, [t for _, t in chain]))
        return calls

    def spy_observe(self, n, target_hidden=None):
        observe(self, n, target_hidden)
        sizes.append((self.features.queued, self.features.nbytes, target_hidden.shape[1] * 4))

    orig_start = head_source.HeadSource.start
    monkeypatch.setattr(head_source.HeadSource, "start", start)
    monkeypatch.setattr(head_source.HeadSource, "depth", depth)
    monkeypatch.setattr(head_source.HeadSource, "extend", spy_extend)
    monkeypatch.setattr(head_source.HeadSource, "observe", spy_observe)
    return chains, sizes


def test_auto_head_sitting_out_keeps_a_bounded_queue_and_drafts_right_after(oracle_fused, monkeypatch):
    """The oracle head sits out 60 steps (auto keeps feeding it features), then drafts: its queue never held more
    than the window, and its chains after sitting out are exactly the target's continuation; output equals plain."""
    from specrt.runtime.proposers.auto import state_for
    from specrt.runtime.tree_budget import fixed_costs

    gen = oracle_fused
    state_for(gen).costs = fixed_costs(gen.max_draft_tokens + 1)
    plain = gen.generate(PROMPTS[0], 90, method="none")
    chains, sizes = _head_chains(monkeypatch, sit_out=60)
    spec = gen.generate(PROMPTS[0], 90, method="auto")
    assert spec.token_ids == plain.token_ids
    assert len(sizes) >= 10 and max(q for q, _, _ in sizes) <= 8  # (other sources draft: steps of several tokens)
    assert max(b for _, b, _ in sizes) <= 2 * 8 * sizes[0][2]
    end = spec.stats.prompt_tokens + len(spec.token_ids)
    checked = 0
    for tokens, n, chain in chains:
        assert n >= spec.stats.prompt_tokens + 60  # nothing drafted while it sat out
        want = tokens[n:min(n + len(chain), end)].tolist()
        assert chain[:len(want)] == want
        checked += len(want)
    assert checked >= 6


class _SitOut:
    """A k policy: k = 0 (the head sits out) for `steps` steps, then 3."""

    def __init__(self, steps: int) -> None:
        self.steps, self.current_k = steps, 0

    def next_k(self) -> int:
        self.steps -= 1
        self.current_k = 0 if self.steps >= 0 else 3
        return self.current_k

    def update(self, *args) -> None:
        pass


def test_head_method_sitting_out_keeps_a_bounded_queue_and_drafts_right_after(oracle_fused, monkeypatch):
    """The `head` method's proposer (head.py) with k = 0 for 60 steps, then k = 3: the same bound, and once it
    drafts again every draft of the oracle head is accepted."""
    from specrt.runtime.proposers import head, head_features

    monkeypatch.setattr(head_features, "WINDOW", 8)
    sizes = []
    observe = head.HeadProposer.observe

    def spy(self, n, num_accepted, target_hidden=None):
        observe(self, n, num_accepted, target_hidden)
        sizes.append(self.features.queued)

    monkeypatch.setattr(head.HeadProposer, "observe", spy)
    gen = oracle_fused
    monkeypatch.setattr(gen, "make_policy", lambda *a, **kw: _SitOut(60))
    plain = gen.generate(PROMPTS[1], 90, method="none")
    spec = gen.generate(PROMPTS[1], 90, method="head")
    assert spec.token_ids == plain.token_ids
    assert len(sizes) >= 60 and max(sizes) <= 8
    assert spec.stats.drafted_tokens >= 9 and spec.stats.accepted_tokens == spec.stats.drafted_tokens
