"""`--method auto` (runtime/proposers/auto.py): every source in one tree sized by goodput, the default method.
Greedy output equals plain decoding on real toy bundles (trees, chains, a draft model as a source); drafts that stop
paying give plain steps within a few steps and drafting resumes when they recover; seeded sampling is reproducible."""

from __future__ import annotations

import numpy as np

from specrt.runtime import load
from specrt.runtime.proposers.auto import PRIORS, AutoProposer, AutoState, state_for, use_free_rows
from specrt.runtime.proposers.recycle_table import SuccessorTable
from specrt.runtime.tree_budget import NodeStats, PassCosts

PROMPTS = ("def main(argv):\n    return", "the cat sat on the mat and the cat sat on the")


def steps_of(gen, prompt, method, **kw):
    seen = []
    res = gen.generate(prompt, 40, method=method, temperature=0, on_step=lambda k, d, a: seen.append((d, a)), **kw)
    return res, seen


def test_auto_is_the_default_and_greedy_output_equals_plain(target_only_bundle):
    gen = load(target_only_bundle, threads=1)
    assert gen.default_method == "auto" and "auto" in gen.methods and gen.target.supports_tree
    trees = 0
    for prompt in PROMPTS:
        plain = gen.generate(prompt, 40, method="none", temperature=0).token_ids
        res = gen.generate(prompt, 40, temperature=0)  # the default method
        assert res.token_ids == plain and res.stats.method == "auto"
        fixed, _ = steps_of(gen, prompt, "auto", num_speculative_tokens=2)  # an integer k caps the nodes
        assert fixed.token_ids == plain and max(fixed.stats.k_history) <= 2
        trees += res.stats.drafted_tokens
    assert trees > 0


def test_auto_on_a_chain_only_target_equals_plain(target_only_bundle):
    gen = load(target_only_bundle, threads=1)
    gen.target.supports_tree = False  # as an int4 target at accuracy level 4 (docs/trees.md)
    proposer = gen.make_proposer("auto", gen.request().sampling, np.random.default_rng(0), {})
    assert not proposer.trees
    for prompt in PROMPTS:
        plain = gen.generate(prompt, 40, method="none", temperature=0).token_ids
        res, _ = steps_of(gen, prompt, "auto")
        assert res.token_ids == plain


def test_a_draft_model_joins_the_tree_where_it_pays(self_generator, monkeypatch):
    """The target as its own draft: every draft token is accepted, so a draft priced below what its tokens save runs
    in the tree; output stays plain's. Priced, not timed: a pass costs 1 + 0.05 a row (fixed_costs) and a draft call
    starts at 0.05 of a pass, so whether it runs does not hang on how busy the machine is (the draft here is the
    target itself: on the clock it is as dear as a pass and runs only now and then, or not at all on a loaded one)."""
    from specrt.runtime.tree_budget import fixed_costs

    gen = self_generator
    prompt = "In the beginning there was"
    plain = gen.generate(prompt, 40, method="none", temperature=0).token_ids
    monkeypatch.setattr(state_for(gen), "costs", fixed_costs(gen.max_draft_tokens + 1))
    monkeypatch.setattr(gen, "_load_costs", (state_for(gen).costs.table(), 0.05, None))
    res, seen = steps_of(gen, prompt, "auto")
    assert res.token_ids == plain
    assert res.stats.draft_calls > 0 and sum(d > 0 for d, _ in seen) > 0


def test_seeded_sampling_is_reproducible(target_only_bundle):
    gen = load(target_only_bundle, threads=1)
    runs = [gen.generate(PROMPTS[1], 30, method="auto", temperature=0.8, seed=5).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_seeded_sampling_drafts_with_the_draft_model_whatever_the_clock(self_generator, monkeypatch):
    """Seeded sampling prices the draft model by its weights (as the head), never by the clock: it drafts where that
    price pays (a cost of 0 never drafted at all), and a clock that says each draft call took 10 s gives the same
    text (the tree, hence the random numbers drawn, depend on the request alone)."""
    import types

    from specrt.runtime import policy
    from specrt.runtime.proposers import auto

    gen = self_generator  # the target as its own draft: every draft is accepted
    # its weights cost what the target's do (it never pays at that price): price it as a draft 1/20 of the target
    monkeypatch.setattr(policy, "model_draft_cost", lambda method, manifest: 0.05)
    kw = dict(method="auto", temperature=0.8, seed=11)
    first = gen.generate("In the beginning there was", 30, **kw)
    assert first.stats.draft_calls > 0
    ticks = iter(range(0, 10 ** 6, 10))
    monkeypatch.setattr(auto, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    again = gen.generate("In the beginning there was", 30, **kw)
    assert again.token_ids == first.token_ids and again.stats.draft_calls == first.stats.draft_calls


def fake_step(proposer, tokens, n, committed):
    """One step: propose, then commit `committed` (what the target chose); returns the proposal's node count."""
    prop = proposer.propose(tokens, n, 8)
    tokens[n:n + len(committed)] = committed
    proposer.observe(n + len(committed), 0)
    return prop.token_ids.size, n + len(committed)


def test_drafts_that_stop_paying_fall_back_to_plain_and_resume():
    """A first request on a fresh state (priors and load-time costs only): the table says 7 -> 8 -> 9 ..., the text
    goes elsewhere; within a few steps the proposer drafts nothing, and drafts again once the table is right."""
    vocab = 512
    table = SuccessorTable(vocab, top_k=2)
    table.succ[:, 0] = (np.arange(vocab) + 1) % vocab  # t -> t + 1
    table.succ[:, 1] = (np.arange(vocab) + 2) % vocab
    state = AutoState(PassCosts([0.02 * (1 + 0.05 * s) for s in range(9)]))  # fp32-like T(S)
    proposer = AutoProposer(table, state, trees=True, max_n=1)
    proposer.rows_seen = True  # the table is not corrected by committed pairs (as when the loop refreshes it)
    tokens = np.zeros(400, np.int64)
    tokens[:3] = [40, 50, 60]
    n = 3
    proposer.start(tokens, n)
    sizes = []
    for _ in range(12):  # the target never follows the table (t -> t + 3) and never repeats itself
        size, n = fake_step(proposer, tokens, n, [int(tokens[n - 1]) + 3])
        sizes.append(size)
    assert sizes[0] > 0  # the priors draft on the first steps of the first request
    assert sizes[-4:] == [0, 0, 0, 0], sizes  # then plain steps
    assert state.plain_steps >= 4
    resumed = []
    for _ in range(12):  # the text now follows the table: its depth-1 candidates match, drafting resumes
        size, n = fake_step(proposer, tokens, n, [int(tokens[n - 1]) + 1])
        resumed.append(size)
    assert resumed[-1] > 0, resumed


def test_the_tree_follows_how_sure_the_target_was():
    """Two tables with the same successors: one learned from rows where the target was sure of them, one from rows
    where its top two were nearly tied. Ranks alone rate them alike (and a static rank template stopped at depth 5);
    the confidences draft the sure chain as deep as the node cap allows and keep the unsure tree shallow."""
    vocab = 256
    depths = {}
    for name, runner_up in (("sure", 8.0), ("tied", 19.9)):
        table = SuccessorTable(vocab, top_k=2)
        logits = np.zeros((vocab, vocab), np.float32)
        logits[np.arange(vocab), (np.arange(vocab) + 1) % vocab] = 20.0  # t -> t + 1 first
        logits[np.arange(vocab), (np.arange(vocab) + 2) % vocab] = runner_up
        table.refresh(np.arange(vocab), logits)
        state = AutoState(PassCosts([0.02 * (1 + 0.05 * s) for s in range(9)]))  # fp32-like T(S)
        proposer = AutoProposer(table, state, trees=True, max_n=1)
        proposer.rows_seen = True
        tokens = np.zeros(64, np.int64)
        tokens[:3] = [40, 50, 60]
        proposer.start(tokens, 3)
        prop = proposer.propose(tokens, 3, 8)
        depth = [0] * prop.token_ids.size
        for i, p in enumerate(prop.parents.tolist()):
            depth[i] = 1 if p < 0 else depth[p] + 1
        depths[name] = max(depth, default=0)
        if name == "sure":
            assert prop.token_ids.tolist() == [61, 62, 63, 64, 65, 66, 67, 68]  # the chain t -> t + 1, 8 deep
    assert depths["sure"] == 8 and depths["tied"] <= 3, depths


def test_priors_are_probabilities_for_every_source():
    stats = NodeStats(PRIORS)
    for source in PRIORS:
        for depth in (1, 2, 9):
            for rank in range(4):
                assert 0.0 < stats.prob(NodeStats.key(source, depth, rank)) <= 1.0


def test_batched_requests_run_auto_with_plain_output(target_only_bundle):
    gen = load(target_only_bundle, threads=1)
    with gen.engine(max_batch=2) as eng:
        assert "auto" in eng.scheduler.methods
        got = eng.generate_batch(list(PROMPTS), 20, temperature=0)  # the default method, batched
    for r, p in zip(got, PROMPTS):
        assert r.token_ids == gen.generate(p, 20, method="none", temperature=0).token_ids


def test_free_rows_fill_the_tree_up_to_the_cap(target_only_bundle):
    """`specrt bench --free-rows` (use_free_rows): every pass priced at T(1), so the tree takes every candidate up to
    the node cap where the measured costs of dear rows (int4-like) take a few; greedy output is still plain's."""
    vocab = 512
    table = SuccessorTable(vocab, top_k=2)
    table.succ[:, 0] = (np.arange(vocab) + 1) % vocab  # t -> t + 1, t + 2: a binary tree of candidates
    table.succ[:, 1] = (np.arange(vocab) + 2) % vocab
    dear = [0.02 * (1 + 0.3 * s) for s in range(9)]  # T(S)/T(1) = 1 + 0.3 (S - 1)
    sizes = {}
    for free in (False, True):
        proposer = AutoProposer(table, AutoState(PassCosts(dear, free_rows=free)), trees=True, max_n=1)
        proposer.rows_seen = True
        tokens = np.zeros(64, np.int64)
        tokens[:3] = [40, 50, 60]
        proposer.start(tokens, 3)
        sizes[free] = len(proposer.propose(tokens, 3, 8).token_ids)
    assert sizes[True] == 8 and sizes[False] < 8, sizes
    gen = load(target_only_bundle, threads=1)
    plain = gen.generate(PROMPTS[1], 24, method="none", temperature=0).token_ids
    state = use_free_rows(gen)
    assert state_for(gen) is state and state.costs.free_rows
    assert gen.generate(PROMPTS[1], 24, method="auto", temperature=0).token_ids == plain


def test_a_copied_passage_is_its_own_ngram_source():
    """A continuation whose match runs COPY_RUN tokens back (the text is being copied) is keyed `ngramL`, one whose
    match is a 2-3 token coincidence `ngram`: each gets its own running acceptance (a copy goes on far more often)."""
    from specrt.runtime.proposers.auto import COPY_RUN
    from specrt.runtime.proposers.ngram_branches import match_length

    rng = np.random.default_rng(0)
    passage = rng.permutation(np.arange(100, 140))[:20]
    tokens = np.zeros(200, np.int64)
    text = [*passage, 7, 8, *passage[:12]]  # the passage, then its copy under way (12 tokens in)
    tokens[:len(text)] = text
    n = len(text)
    assert match_length(tokens, n, 12, 50) == 12  # as far back as the copy goes (cap: its start)
    assert match_length(tokens, n, 12, 4) == 4
    proposer = AutoProposer(SuccessorTable(256, top_k=2), AutoState(PassCosts([0.02] * 9)), trees=True)
    proposer.start(tokens, n)
    trie, keys = proposer.candidates(tokens, n, 4)
    first = [trie.tokens[i] for i, ks in enumerate(keys) if ("ngramL", 1, 0) in ks]
    assert first == [int(passage[12])]  # the copy's next token, as a copy
    short = [*passage[:5], 9, 9, *passage[3:5]]  # only two tokens repeat: a coincidence
    tokens[:len(short)] = short
    proposer.start(tokens, len(short))
    trie, keys = proposer.candidates(tokens, len(short), 4)
    sources = {k[0] for ks in keys for k in ks if k[0].startswith("ngram")}
    assert "ngram" in sources and "ngramL" not in sources and COPY_RUN > 2
