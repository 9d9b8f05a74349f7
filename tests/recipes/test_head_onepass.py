"""The head's data made in one pass (recipes/head_onepass.py, #52): the decoder's own steps give the answers and the
features; they equal the teacher-forced features, the batch engine's answers, and shards of either maker mix."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specrt.recipes.head_shards import make_shards, requests_of, sequence_features

NAMES = ("ids", "starts", "feats", "top_ids", "top_logits")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread, as the data job runs (two threads on this shared CPU were 15x slower in wall time)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _decoder(path):
    from specrt.models.checkpoint import open_checkpoint

    return open_checkpoint(path).load_decoder(torch.float32).eval().requires_grad_(False)


def _requests():
    return requests_of([f"def f{i}(x):" for i in range(10)], styles=("", " return"))


def _load(shard):
    out = {n: np.load(shard / f"{n}.npy") for n in NAMES}
    out["meta"] = json.loads((shard / "meta.json").read_text())
    return out


def _assert_top_close(a, b):
    """Top-K logits equal within fp16 rounding; ids equal wherever the logits are not a near-tie."""
    np.testing.assert_allclose(a["top_logits"].astype(np.float32), b["top_logits"].astype(np.float32), atol=2e-3,
                               rtol=2e-3)
    gaps = np.abs(np.diff(a["top_logits"].astype(np.float32), axis=1))  # [N, K - 1]
    clear = np.concatenate((gaps, np.full_like(gaps[:, :1], np.inf)), axis=1) > 1e-2
    clear &= np.concatenate((np.full_like(gaps[:, :1], np.inf), gaps), axis=1) > 1e-2
    assert (a["top_ids"][clear] == b["top_ids"][clear]).all() and clear.mean() > 0.5


@pytest.fixture(scope="module")
def onepass_dir(workdir, llama_target):
    from specrt.recipes.head_data import chat_encoder

    run = workdir / "onepass_shards"
    made = make_shards(None, _decoder(llama_target), chat_encoder(llama_target), _requests(), run, max_new=8,
                       samples=1, batch=8, layers=(0, 1), slots=5)  # 5 slots for 36 + 1 answers: refilled
    assert made == 3
    return run


def test_onepass_features_equal_teacher_forced(onepass_dir, llama_target):
    """Every row's features (the taps and the final hidden state) and top-K equal a teacher-forced pass over the same
    tokens (sequence_features, the engine maker's second pass) within fp16 rounding."""
    dec = _decoder(llama_target)
    for c in range(3):
        got = _load(onepass_dir / f"shard-{c:05d}")
        st = got["starts"]
        seqs = [got["ids"][st[i]:st[i + 1]].tolist() for i in range(len(st) - 1)]
        ref = sequence_features(dec, seqs, (0, 1))
        want = {"feats": np.concatenate([r[0] for r in ref]), "top_ids": np.concatenate([r[1] for r in ref]),
                "top_logits": np.concatenate([r[2] for r in ref])}
        assert got["feats"].dtype == np.float16 and got["feats"].shape == want["feats"].shape
        np.testing.assert_allclose(got["feats"].astype(np.float32), want["feats"].astype(np.float32), atol=2e-3,
                                   rtol=2e-3)
        _assert_top_close(got, want)
        answers = [len(s) - m["prompt_len"] for s, m in zip(seqs, got["meta"])]
        assert max(answers) == 8 and min(answers) >= 1  # max_new; an answer ends at EOS or there


def test_onepass_answers_equal_the_batch_engine(onepass_dir, workdir, llama_target, target_only_bundle):
    """The same requests through the engine maker (ONNX Runtime answers, teacher-forced features): the same
    sequences (greedy and seeded samples: the runtime's own sampling rule), the same layout, features within fp16."""
    from specrt.recipes.head_data import chat_encoder

    run = workdir / "engine_shards"
    assert make_shards(target_only_bundle, _decoder(llama_target), chat_encoder(llama_target), _requests(), run,
                       max_new=8, samples=1, batch=8, layers=(0, 1), maker="engine") == 3
    for c in range(3):
        a, b = _load(onepass_dir / f"shard-{c:05d}"), _load(run / f"shard-{c:05d}")
        assert a["meta"] == b["meta"] and np.array_equal(a["starts"], b["starts"])
        assert np.array_equal(a["ids"], b["ids"])
        for n in NAMES:
            assert a[n].dtype == b[n].dtype and a[n].shape == b[n].shape, n
        np.testing.assert_allclose(a["feats"].astype(np.float32), b["feats"].astype(np.float32), atol=2e-3, rtol=2e-3)
        _assert_top_close(a, b)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in onepass_dir.iterdir())


def test_makers_resume_each_others_shards(onepass_dir, workdir, llama_target):
    """A shard made by either maker is skipped on resume; the set reads shards of both kinds."""
    import shutil

    from specrt.recipes.head_data import chat_encoder
    from specrt.recipes.head_shardset import ShardSet

    mixed = workdir / "mixed_shards"
    shutil.copytree(workdir / "engine_shards", mixed)
    shutil.rmtree(mixed / "shard-00001")
    kept = {c: (mixed / f"shard-{c:05d}" / "feats.npy").stat().st_mtime_ns for c in (0, 2)}
    said = []
    assert make_shards(None, _decoder(llama_target), chat_encoder(llama_target), _requests(), mixed, max_new=8,
                       samples=1, batch=8, layers=(0, 1), say=said.append) == 3
    assert len(said) == 1 and said[0].startswith("shard 1 ")  # only the missing one was made
    assert kept == {c: (mixed / f"shard-{c:05d}" / "feats.npy").stat().st_mtime_ns for c in (0, 2)}
    data = ShardSet(mixed)
    assert len(data.train) == 36 and len(data.heldout) == 1
    seq = data.sequence(data.train[-1])
    assert seq["feats"].shape[1:] == (3, 64) and seq["top_ids"].shape == (seq["ids"].numel(), 32)


def test_slots_do_not_change_the_answers(onepass_dir, workdir, llama_target):
    """One slot (no batching) and many (every answer at once) give the same sequences as 5 slots with refills (this
    tiny target has no near-ties; on a real one a batch size's rounding can move a seeded draw next to a boundary)."""
    from specrt.recipes.head_data import chat_encoder

    for slots in (1, 64):
        run = workdir / f"onepass_{slots}"
        make_shards(None, _decoder(llama_target), chat_encoder(llama_target), _requests(), run, max_new=8, samples=1,
                    batch=8, layers=(0, 1), slots=slots)
        for c in range(3):
            a, b = _load(onepass_dir / f"shard-{c:05d}"), _load(run / f"shard-{c:05d}")
            assert np.array_equal(a["ids"], b["ids"]) and a["meta"] == b["meta"]
            np.testing.assert_allclose(a["feats"].astype(np.float32), b["feats"].astype(np.float32), atol=2e-3,
                                       rtol=2e-3)


def test_bad_maker_options_are_refused(workdir, llama_target):
    from specrt.core.errors import InvalidArgument

    dec = _decoder(llama_target)
    with pytest.raises(InvalidArgument, match="maker must be one of onepass, engine, got 'ort'"):
        make_shards(None, dec, None, _requests(), workdir / "bad", max_new=8, samples=1, maker="ort")
    with pytest.raises(InvalidArgument, match="slots and engine_batch must be >= 1, got 0"):
        make_shards(None, dec, None, _requests(), workdir / "bad", max_new=8, samples=1, slots=0)
    with pytest.raises(InvalidArgument, match="--answers-bundle"):
        make_shards(None, dec, lambda t: [1, 2], _requests(), workdir / "bad", max_new=8, samples=1, maker="engine")


def test_answer_chunks_across_chunks_and_a_longer_prompt(llama_target):
    """answer_chunks directly: two chunks sharing 2 slots, the second with a prompt longer than the cache was made
    for (the cache grows with answers in flight); greedy answers equal the one-sequence PyTorch decoding
    (head_data.generate_features), sampled ones are reproducible from their seeds, and a chunk is handed over once
    all its answers are made."""
    from specrt.recipes.head_data import generate_features
    from specrt.recipes.head_onepass import answer_chunks
    from specrt.runtime.sampling import SamplingParams

    dec = _decoder(llama_target)
    eos = {int(e) for e in dec.config.eos_token_ids}
    short, long = [[5, 6, 7], [9, 10]], [list(range(20, 60))]
    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.8, seed=11)
    chunks = [(0, short, [(0, greedy), (1, greedy), (0, sampled)]), (1, long, [(0, greedy), (0, sampled)])]
    got = {}

    def run(slots):
        out = {}
        answer_chunks(dec, iter(chunks), lambda c, *rest: out.setdefault(c, rest), max_new=12, layers=(0, 1),
                      top_k=8, eos=eos, slots=slots)
        return out

    got = run(2)
    assert sorted(got) == [0, 1] and [len(got[c][0]) for c in (0, 1)] == [3, 2]
    for c, prompts, plan in chunks:
        seqs, prompt_lens, feats = got[c]
        for (i, params), seq, n, f in zip(plan, seqs, prompt_lens, feats):
            assert seq[:n] == prompts[i] and f[0].shape == (len(seq), 3, 64) and f[1].shape == (len(seq), 8)
            if params.greedy:
                ref = generate_features(dec, prompts[i], 12, eos, 0.0, torch.Generator())
                assert seq == ref["ids"].tolist()
                np.testing.assert_allclose(f[0][:, -1].astype(np.float32), ref["features"].float().numpy(),
                                           atol=2e-3, rtol=2e-3)
    again = run(5)
    assert all(again[c][0] == got[c][0] for c in (0, 1))  # the seeded samples too


def test_past_the_deadline_no_chunk_is_started(workdir, llama_target):
    import time

    from specrt.recipes.head_data import chat_encoder

    run = workdir / "late_shards"
    assert make_shards(None, _decoder(llama_target), chat_encoder(llama_target), _requests(), run, max_new=8,
                       samples=1, batch=8, layers=(0, 1), deadline=time.time() - 1) == 0
    assert not list(run.glob("shard-*"))
