"""The draft-head proposer on a real compiled bundle: alignment proven by an oracle head, outputs equal plain.

The oracle: a one-layer Llama target whose attention output is zero (o_proj = 0), so its logits at position t
depend only on token t. A head with fc = [0 | I] (it reads only the embedding of token t + 1), the target's own
layer, norm and full vocabulary then computes exactly the target's next-token logits: if the proposer feeds
features, tokens and positions in the right order, every greedy draft is accepted, after prefill, after partial
acceptance, after hybrid's n-gram steps and after steps with k = 0.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def oracle_bundle(tmp_path_factory, tokenizer_path):
    from helpers import oracle_head_target
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.models.draft_head import DraftHead, save_head

    base = tmp_path_factory.mktemp("oracle_head")  # a fresh folder each time the module's fixture is set up
    target, decoder = oracle_head_target(base / "target", tokenizer_path)
    head = DraftHead(decoder, torch.arange(decoder.config.vocab_size))
    d = decoder.config.hidden_size
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat((torch.zeros(d, d), torch.eye(d)), dim=1))
    save_head(head, base / "head")
    return compile_bundle(CompileSpec(target, base / "bundle", f"head:{base / 'head'}", max_seq_len=128, max_draft_tokens=6))


@pytest.fixture(scope="module")
def oracle(oracle_bundle):
    from specrt.runtime import load

    return load(oracle_bundle, backend="ort")


PROMPTS = ("def main(argv):\n    ", "import os\nimport json\n\n\nclass Config:\n")


def test_manifest_entry(oracle):
    entry = oracle.manifest.draft_head
    assert entry.draft_vocab_size == oracle.vocab_size and entry.validation["max_abs_diff"] < 1e-4
    assert entry.precision == "fp32" and entry.quantization is None and entry.onnx == "draft_head/head.onnx"
    cfg = json.loads(oracle.manifest.path(entry.config).read_text())
    assert cfg["vocab_ids"] == list(range(oracle.vocab_size))
    assert oracle.methods[:2] == ["hybrid", "head"] and oracle.default_method == "auto"  # #52: the head is a source


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_oracle_head_accepts_every_greedy_draft(oracle, prompt, k):
    plain = oracle.generate(prompt, 40, method="none")
    spec = oracle.generate(prompt, 40, method="head", num_speculative_tokens=k)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted_tokens > 0
    assert spec.stats.accepted_tokens == spec.stats.drafted_tokens


def test_hybrid_and_auto_equal_plain(oracle):
    for prompt in PROMPTS:
        plain = oracle.generate(prompt, 48, method="none")
        for method, k in (("hybrid", 2), ("hybrid", "auto"), ("hybrid-head", 3)):
            spec = oracle.generate(prompt, 48, method=method, num_speculative_tokens=k)
            assert spec.token_ids == plain.token_ids
            assert spec.stats.accepted_tokens == spec.stats.drafted_tokens  # both branches are exact here


def test_sampling_with_oracle_head_accepts_everything(oracle):
    """q == p for every draft (same distribution, zero nowhere): min(1, q/p) = 1, all accepted."""
    res = oracle.generate(PROMPTS[0], 30, method="head", temperature=0.9, seed=5, num_speculative_tokens=3)
    assert res.stats.drafted_tokens > 0 and res.stats.accepted_tokens == res.stats.drafted_tokens


def test_sampled_head_proposal_is_zero_outside_its_vocabulary(oracle_bundle):
    """A reduced head gives probabilities on its V' ids only (the rejection rule treats the rest as q-only)."""
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends.head import HeadRunner
    from specrt.runtime.proposers.head import HeadProposer
    from specrt.runtime.sampling import SamplingParams

    manifest = read_manifest(oracle_bundle)
    runner = HeadRunner(manifest, 64)
    vocab = int(runner.vocab_ids.size)
    rng = np.random.default_rng(0)
    prop = HeadProposer(runner, SamplingParams(temperature=1.0), rng, vocab)
    tokens = np.arange(10, dtype=np.int64) + 5
    hidden = np.random.default_rng(1).standard_normal((9, manifest.draft_head.hidden_size)).astype(np.float32)
    prop.start(tokens, 10, hidden)
    p = prop.propose(tokens, 10, 3)
    assert p.probs.shape == (3, vocab) and np.allclose(p.probs.sum(1), 1.0)
    # the head's cache holds the 9 committed rows + 2 draft rows; observe + propose drops the draft rows
    assert runner.length == 11
    prop.observe(11, 0, hidden[:2])
    prop.propose(np.concatenate((tokens, [7])), 11, 1)
    assert runner.length == 10


def test_head_method_needs_a_head(pair_generator):
    from specrt.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="head:DIR"):
        pair_generator.generate("x", 4, method="head")


def test_features_fed_after_steps_the_head_sat_out_are_not_a_per_token_cost(monkeypatch):
    """Rows queued while the head did not draft (k = 0 steps) are fed in the next proposal's first call: that
    call's time beyond an ordinary call is reported as catch-up (as a draft model's is), so adaptive k does not
    see the head as dearer the longer it was off. A runner whose calls take 1 ms + 10 ms per row, on a fake clock that
    only the runner advances (before: real sleeps, which a loaded machine stretched)."""
    from helpers import FakeClock
    from specrt.runtime.proposers import head
    from specrt.runtime.proposers.head import HeadProposer
    from specrt.runtime.sampling import SamplingParams

    clock = FakeClock()
    monkeypatch.setattr(head, "time", clock)

    class SlowRunner:
        vocab_ids = np.arange(8, dtype=np.int64)
        length = 0

        def truncate(self, length):
            self.length = min(self.length, length)

        def __call__(self, features, token_ids, position):
            clock.sleep(0.001 + 0.010 * token_ids.size)
            self.length += token_ids.size
            return np.eye(8, dtype=np.float32)[token_ids % 8], np.asarray(features, np.float32)

    prop = HeadProposer(SlowRunner(), SamplingParams(temperature=0.0), np.random.default_rng(0), 8)
    feats = np.ones((40, 4), np.float32)
    tokens = np.arange(40, dtype=np.int64)
    prop.start(tokens, 5, feats[:1])
    ordinary = prop.propose(tokens, 5, 3)  # one queued row, then two one-row calls: the ordinary call time
    assert ordinary.catch_up_s == 0.0
    prop.observe(6, 0, feats[:1])
    for n in range(7, 12):  # five steps without a proposal: their rows queue
        prop.observe(n, 0, feats[:1])
    after = prop.propose(tokens, 11, 1)  # six queued rows in one call
    assert after.catch_up_s == pytest.approx(0.010 * 5), after.catch_up_s  # 5 rows beyond an ordinary one-row call


def _tampered(bundle, tmp_path, edit_config=None, edit_manifest=None):
    """A copy of `bundle` whose head_config.json (and manifest) were edited and re-signed (checksums recomputed)."""
    import shutil

    from specrt.bundle.manifest import file_entries

    copy = Path(shutil.copytree(bundle, tmp_path / "b"))
    cfg_path = copy / "draft_head" / "head_config.json"
    cfg = json.loads(cfg_path.read_text())
    if edit_config:
        edit_config(cfg)
    cfg_path.write_text(json.dumps(cfg))
    data = json.loads((copy / "manifest.json").read_text())
    if edit_manifest:
        edit_manifest(data)
    data["files"] = file_entries(copy)
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.__setitem__("vocab_ids", c["vocab_ids"][:10]), "vocab_ids holds 10 ids but draft_vocab_size is"),
    (lambda c: (c.__setitem__("vocab_ids", c["vocab_ids"][:10]), c.__setitem__("draft_vocab_size", 10)),
     "vocab_ids holds 10 ids but the manifest's draft_head.draft_vocab_size is 320"),
    (lambda c: c["vocab_ids"].__setitem__(3, 10**6), "vocab_ids holds 1000000, outside the target's 320-token"),
    (lambda c: c["vocab_ids"].__setitem__(3, -1), "vocab_ids holds -1, outside"),
    (lambda c: c["vocab_ids"].__setitem__(3, 5), "vocab_ids holds 5 twice"),
    (lambda c: c["vocab_ids"].__setitem__(3, 2.5), "must hold integer token ids, found 2.5"),
    (lambda c: c["target"].__setitem__("hidden_size", 128), "target.hidden_size is 128 but the head runs on a target "
                                                           "with hidden_size 64"),
    (_set("version", 3), "not a specrt-draft-head version 1 file"),
    (_set("version", 2), "where a plain head"),
])
def test_tampered_head_config_is_refused_at_load(oracle_bundle, tmp_path, edit, says):
    """A re-signed head_config.json that would index past the head's logits or draft ids outside the vocabulary
    (before: IndexError on every request, or out-of-range drafts accepted) is refused by load, naming the field."""
    from specrt.core.errors import ManifestError
    from specrt.runtime import load

    bad = _tampered(oracle_bundle, tmp_path, edit_config=edit)
    with pytest.raises(ManifestError, match=re.escape(says)):
        load(bad, backend="ort")


def test_manifest_head_entry_must_match_its_graph_and_target(oracle_bundle, tmp_path):
    from specrt.bundle.manifest import read_manifest
    from specrt.core.errors import ManifestError

    def vocab(d):
        d["draft_head"]["draft_vocab_size"] = 10
        d["draft_head"]["outputs"][0]["shape"][2] = 10

    bad = _tampered(oracle_bundle, tmp_path, edit_config=_set("draft_vocab_size", 10), edit_manifest=vocab)
    with pytest.raises(ManifestError, match=r"logits has shape \[1, None, 320\], the manifest declares \[1, 'S', 10\]"):
        read_manifest(bad)
