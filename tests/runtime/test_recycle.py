"""`--method recycle` on real bundles: greedy output equals plain, the table persists across requests, the seed
table is written at compile time, listed in the manifest and checked at load."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from specrt.core.errors import BundleError, ChecksumMismatch
from specrt.runtime.proposers.recycle_table import TABLE_FILE, SuccessorTable, check_table, load_table, table_for

PROMPTS = ["the cat sat on the mat and the cat sat on the", "one two three four one two three", "hello world"]


@pytest.fixture(scope="module")
def seeded_bundle(workdir, llama_target):
    """The target alone, compiled with the successor-table step of `specrt compile`."""
    from specrt.cli.recycle_step import recycle_seed_step
    from specrt.compiler import CompileSpec, compile_bundle

    out = workdir / "bundles" / "recycle_seeded"
    if not (out / "manifest.json").exists():
        compile_bundle(CompileSpec(llama_target, out, max_seq_len=64, max_draft_tokens=4),
                       extra_steps=[recycle_seed_step()])
    return out


@pytest.fixture(scope="module")
def plain_gen(target_only_bundle):
    from specrt.runtime import load

    return load(target_only_bundle, backend="ort")


@pytest.mark.parametrize("k", [2, "auto"])
def test_recycle_greedy_output_is_plains(plain_gen, k):
    assert "recycle" in plain_gen.methods
    for prompt in PROMPTS:
        plain = plain_gen.generate(prompt, 40, method="none")
        spec = plain_gen.generate(prompt, 40, method="recycle", num_speculative_tokens=k)
        assert spec.token_ids == plain.token_ids, prompt
        assert spec.stats.method == "recycle"


def test_the_table_persists_across_requests(plain_gen):
    table = table_for(plain_gen)
    table.reset()  # cold start
    assert (table.succ == -1).all()
    first = plain_gen.generate(PROMPTS[0], 30, method="recycle", num_speculative_tokens=3)
    learned = int((table.succ >= 0).sum())
    assert learned > 0 and table_for(plain_gen) is table  # one table per loaded bundle, filled by the request
    ids = first.token_ids  # every committed pair: the target's own greedy successor, first in its row
    assert all(int(table.row(a)[0]) == b for a, b in zip(ids[:-1], ids[1:]) if ids.count(a) == 1)
    again = plain_gen.generate(PROMPTS[0], 30, method="recycle", num_speculative_tokens=3)
    assert again.token_ids == first.token_ids
    assert again.stats.accepted_tokens > first.stats.accepted_tokens  # the second request drafts from the table
    assert table.succ.min() >= -1 and table.succ.max() < plain_gen.vocab_size \
        and table.nbytes == table.succ.size * 6  # ids int32 + conf float16


def test_refresh_keeps_how_sure_the_target_was(plain_gen):
    """A verify pass's rows give each successor's share of its row's top K (what `auto` keys its estimates by);
    rows known only from committed pairs or the seed have none (NaN)."""
    target = plain_gen.target
    ids = np.array([5, 9, 13, 21, 34], dtype=np.int64)
    target.reset()
    logits = target.forward(ids)  # [5, V], the real target's rows
    target.reset()
    table = SuccessorTable(plain_gen.vocab_size)
    assert np.isnan(table.conf).all()
    table.refresh(ids, logits)
    for i, tok in enumerate(ids.tolist()):
        top = np.sort(logits[i])[::-1][:table.top_k]
        want = np.exp(top - top[0]) / np.exp(top - top[0]).sum()
        assert table.succ[tok, 0] == int(logits[i].argmax())
        np.testing.assert_allclose(table.conf[tok].astype(np.float64), want, atol=2e-3)
    table.learn_pairs(ids[:1], ids[1:2])  # a committed pair: no logits, so no confidence for that row
    assert np.isnan(table.conf[5]).all() and not np.isnan(table.conf[9]).any()
    table.reset()
    assert np.isnan(table.conf).all()


def test_refresh_equals_a_full_sort_of_real_rows(plain_gen):
    """The refresh's top K (a partition, or the grouped one where the width is a multiple of 128) is each row's
    first K by a full stable sort of the real target's rows: best first, equal values lower id first (#51)."""
    target = plain_gen.target
    ids = np.array([3, 8, 13, 21, 34, 55, 89, 144, 233], dtype=np.int64)  # a 9-row pass, like SmolLM2's k = 8
    target.reset()
    logits = target.forward(ids)  # [9, V]
    target.reset()
    wide = np.concatenate([logits, logits[:, ::-1] - 0.5, logits[::-1] - 0.25, logits[::-1, ::-1] - 0.75], axis=1)
    assert wide.shape[1] % 128 == 0
    for rows in (logits, wide):  # the toy's vocabulary (320 columns: partition) and 10 groups of 128 (grouped)
        table = SuccessorTable(rows.shape[1])
        argmax = table.refresh(ids, rows)
        assert argmax == rows.argmax(axis=-1).tolist()  # what the greedy rule takes instead of its own argmax
        for i, tok in enumerate(ids.tolist()):
            assert table.succ[tok].tolist() == np.argsort(-rows[i], kind="stable")[:table.top_k].tolist()


def test_greedy_steps_take_the_refresh_argmax_and_stay_plains(plain_gen, monkeypatch):
    """auto's verify passes hand the greedy rule the rows' argmax from the table's refresh (no second read of the
    logits), and the output is plain decoding's; a user's proposer whose observe_verify returns a list of its own
    is not trusted with it."""
    from specrt.runtime import acceptance, step

    given = []

    def spy(rule):
        def wrapped(*args):
            given.append(isinstance(args[-1], list))  # the rows' argmax, not only the logits
            return rule(*args)
        return wrapped

    monkeypatch.setattr(step, "greedy_accept", spy(acceptance.greedy_accept))
    monkeypatch.setattr(step, "greedy_accept_tree", spy(acceptance.greedy_accept_tree))
    for prompt in PROMPTS:
        plain = plain_gen.generate(prompt, 40, method="none")
        given.clear()
        spec = plain_gen.generate(prompt, 40, method="auto")
        assert spec.token_ids == plain.token_ids, prompt
        assert given and all(given), prompt

    class Liar:  # drafts nothing; claims every row's argmax is token 0
        name = "liar"

        def start(self, tokens, n, target_hidden=None): ...

        def propose(self, tokens, n, k):
            from specrt.runtime.proposers.base import Proposal
            return Proposal.point_mass(tokens[n - 1:n])

        def observe(self, n, num_accepted, target_hidden=None): ...

        def observe_verify(self, fed_ids, logits, parents=None):
            return [0] * fed_ids.size

    given.clear()
    lied = plain_gen.generate(PROMPTS[0], 20, proposer=Liar(), num_speculative_tokens=1)
    assert lied.token_ids == plain_gen.generate(PROMPTS[0], 20, method="none").token_ids
    assert given and not any(given)


@pytest.mark.slow  # compiles a bundle (~30 s on 2 busy cores)
def test_compile_seeds_the_table_into_the_bundle(seeded_bundle):
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime import load

    manifest = read_manifest(seeded_bundle, verify_checksums=True)
    assert TABLE_FILE in manifest.files
    gen = load(seeded_bundle, backend="ort")
    seed = load_table(gen.manifest, gen.vocab_size)
    assert seed.dtype == np.int32 and seed.shape == (gen.vocab_size, 8) and (seed >= 0).sum() > 20
    assert (table_for(gen).succ == seed).all()
    for prompt in PROMPTS:
        assert gen.generate(prompt, 30, method="recycle").token_ids == gen.generate(prompt, 30, method="none").token_ids


@pytest.mark.slow
def test_a_tampered_table_is_refused(seeded_bundle, tmp_path):
    from specrt.runtime import load

    copy = tmp_path / "b"
    shutil.copytree(seeded_bundle, copy)
    table = np.load(copy / TABLE_FILE)
    table[0, 0] = (table[0, 0] + 1) % 5
    np.save(copy / TABLE_FILE, table)  # same size, other bytes
    with pytest.raises(ChecksumMismatch, match="recycle/table.npy"):
        load(copy, backend="ort", warmup=False)  # listed in the manifest: checked at load like every file
    gen = load(copy, backend="ort", warmup=False, verify_checksums=False)
    with pytest.raises(ChecksumMismatch, match="recycle/table.npy"):  # and again when the method reads it
        gen.generate("hello", 8, method="recycle")
    assert gen.generate("hello", 8, method="ngram").token_ids  # the other methods are unaffected


@pytest.mark.parametrize("bad,match", [(np.zeros((10, 8), dtype=np.int64), "int32"),
                                       (np.zeros((9, 8), dtype=np.int32), "shape"),
                                       (np.full((10, 8), 10, dtype=np.int32), "outside"),
                                       (np.full((10, 8), -2, dtype=np.int32), "outside")])
def test_table_checks(bad, match):
    with pytest.raises(BundleError, match=match):
        check_table(bad, 10, TABLE_FILE)
