"""The hybrid proposer (n-gram where the context has a match, else the draft model) on real ONNX Runtime sessions:
greedy output equals plain decoding with both branches used, the draft's cache catches up after n-gram steps,
sampling stays lossless, and the stats say which branch proposed."""

import numpy as np
import pytest

from specrt.runtime.proposers.hybrid import HybridProposer
from specrt.runtime.sampling import SamplingParams

from test_loop import PROMPTS, _sample_joint, eos

# Repeats itself (n-gram matches) and continues into text the prompt does not have (the draft's turn).
REPEATING = "import os\nimport sys\nimport os\nimport sys\ndef main(argv):\n    "


class Recorder:
    """Wraps a proposer and records the branch of every proposal, in order."""

    def __init__(self, inner):
        self.inner, self.name, self.sources = inner, inner.name, []

    def start(self, tokens, n, target_hidden=None):
        self.inner.start(tokens, n, target_hidden)

    def propose(self, tokens, n, k):
        p = self.inner.propose(tokens, n, k)
        self.sources.append(p.source)
        return p

    def observe(self, n, num_accepted, target_hidden=None):
        self.inner.observe(n, num_accepted, target_hidden)


def hybrid(gen, **options):
    params = SamplingParams()
    return Recorder(gen.make_proposer("hybrid", params, params.rng(), options))


def test_hybrid_is_registered(pair_generator):
    from specrt.runtime.generator import METHODS

    assert "hybrid" in METHODS and "hybrid" in pair_generator.methods
    assert isinstance(hybrid(pair_generator).inner, HybridProposer)


@pytest.mark.parametrize("k", [2, 5])
def test_greedy_equals_plain_with_both_branches(pair_generator, k):
    for prompt in (REPEATING, *PROMPTS):
        plain = pair_generator.generate(prompt, 40, method="none")
        spec = pair_generator.generate(prompt, 40, method="hybrid", num_speculative_tokens=k)
        assert spec.token_ids == plain.token_ids and spec.text == plain.text
        b = spec.stats.branches
        assert sum(v["steps"] for v in b.values()) <= spec.stats.verify_steps
        assert sum(v["drafted"] for v in b.values()) == spec.stats.drafted_tokens
        assert sum(v["accepted"] for v in b.values()) == spec.stats.accepted_tokens
    spec = pair_generator.generate(REPEATING, 40, method="hybrid", num_speculative_tokens=k)
    b = spec.stats.branches
    assert b["ngram"]["steps"] > 0 and b["draft"]["steps"] > 0, b
    assert spec.stats.method == "hybrid" and spec.to_dict()["stats"]["branches"] == b


def test_draft_catches_up_after_ngram_steps(self_generator):
    """Draft == target: every draft-branch token is accepted only if the draft's cache holds exactly the committed
    tokens, including those drafted by the n-gram branch it never saw (fed in one catch-up pass)."""
    with eos(self_generator, []):
        plain = self_generator.generate(REPEATING, 60, method="none")
        rec = hybrid(self_generator, min_n=1)
        spec = self_generator.generate(REPEATING, 60, proposer=rec, num_speculative_tokens=3)
    assert spec.token_ids == plain.token_ids
    switches = sum(1 for a, b in zip(rec.sources, rec.sources[1:]) if (a, b) == ("ngram", "draft"))
    assert switches > 0, rec.sources  # a draft proposal right after n-gram steps: the catch-up ran
    d = spec.stats.branches["draft"]
    assert d["drafted"] > 0 and d["accepted"] == d["drafted"], spec.stats.branches
    assert spec.stats.branches["ngram"]["drafted"] > 0


def test_ngram_sizes_apply_to_the_ngram_branch(pair_generator):
    """ngram_min 1 finds a match almost everywhere; a longer minimum leaves more steps to the draft."""
    # a fixed k: adaptive k measures wall-clock costs and may switch speculation off on a loaded machine
    short = pair_generator.generate(REPEATING, 40, method="hybrid", num_speculative_tokens=3, ngram_min=1, ngram_max=1)
    long = pair_generator.generate(REPEATING, 40, method="hybrid", num_speculative_tokens=3, ngram_min=4, ngram_max=4)
    assert short.token_ids == long.token_ids
    assert short.stats.branches["ngram"]["steps"] > long.stats.branches.get("ngram", {"steps": 0})["steps"]


def test_hybrid_needs_a_draft(target_only_bundle):
    from specrt.core.errors import InvalidArgument
    from specrt.runtime import load

    gen = load(target_only_bundle, backend="ort")
    assert "hybrid" not in gen.methods
    with pytest.raises(InvalidArgument, match="method 'hybrid' needs a bundle compiled with --draft"):
        gen.generate("import os", 4, method="hybrid")
    assert gen.generate("import os", 4, method="none").token_ids  # still usable


# 3000 sampled generations (10-20 s on the portable graph): the fused graph's run in the fast lane, both in the
# full run (the loop under test is the same code on either graph; both graphs' logits are checked elsewhere)
@pytest.mark.parametrize("pair_generator", ["ort", pytest.param("ort-portable", marks=pytest.mark.slow)],
                         indirect=True)
def test_sampling_stays_lossless(pair_generator):
    """Speculative sampling through both branches emits the target's exact joint distribution (top-k 3)."""
    # base + its own greedy continuation + base: when the first sampled token repeats the continuation's first
    # token the n-gram branch has a match, otherwise (another of the top 3) the draft model drafts
    base = pair_generator.tokenizer.encode(PROMPTS[0])
    cont = pair_generator.generate(base, 8, method="none").token_ids
    tv, used = _sample_joint(pair_generator, base + cont + base, "hybrid")
    assert used.get("ngram", 0) > 100 and used.get("draft", 0) > 100, used
    assert tv < 0.08, f"total variation {tv:.3f} between hybrid samples and the exact target distribution"
