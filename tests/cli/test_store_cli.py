"""`specrt store BUNDLE --from SOURCE | --answers PROMPTS`: texts and the bundle's own answers into a datastore that
`--method auto` drafts from (output identical to plain); bad input is one line, exit 2, and leaves the bundle as it
was (manifest and files unchanged, no temporary left). `specrt compile --store SOURCE` writes one into the new
bundle."""

import json
import re
import shutil

import numpy as np
import pytest
from helpers import run_cli

from specrt.runtime.proposers.store import CORPUS_FILE

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture()
def bundle(target_only_bundle, tmp_path):
    path = tmp_path / "bundle"
    shutil.copytree(target_only_bundle, path)
    return path


def generate(bundle, *args):
    r = run_cli("generate", bundle, "--prompt", PROMPT, "--max-new-tokens", 32, "--json", *args)
    return r, (json.loads(r.stdout) if r.returncode == 0 else None)


def snapshot(bundle):
    return {p.relative_to(bundle).as_posix(): p.read_bytes() for p in sorted(bundle.rglob("*")) if p.is_file()}


def test_texts_round_trip_into_auto_drafts_identical_to_plain(bundle, tmp_path):
    _, plain = generate(bundle, "--method", "none")
    r, _ = generate(bundle, "--method", "auto", "--auto-sources", "store")
    assert r.returncode == 2 and "auto source 'store' is not available" in r.stderr  # no datastore yet
    texts = tmp_path / "chats.jsonl"
    texts.write_text(json.dumps({"messages": [{"role": "user", "content": "go on"},
                                              {"role": "assistant", "content": PROMPT + plain["text"]}]}) + "\n"
                     + json.dumps({"text": "an unrelated line of text"}) + "\n")
    r = run_cli("store", bundle, "--from", texts, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["sequences"] == 2 and summary["tokens"] >= 32 and (bundle / CORPUS_FILE).is_file()
    r, spec = generate(bundle, "--method", "auto", "--auto-sources", "store")
    assert r.returncode == 0, r.stderr
    assert spec["token_ids"] == plain["token_ids"] and spec["stats"]["accepted_tokens"] >= 10, spec["stats"]
    # replacing it with a .txt: the datastore is the new one, and no temporary is left behind
    lines = tmp_path / "lines.txt"
    lines.write_text("one line\n\nanother line\n")
    r = run_cli("store", bundle, "--from", lines, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["sequences"] == 2, r.stderr
    assert sorted(p.name for p in bundle.iterdir() if p.name.startswith(".")) == []
    assert run_cli("inspect", bundle).returncode == 0  # every file checks against the rewritten manifest


def test_answers_are_the_bundles_own_greedy_answers(bundle, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nthe lazy dog\n")
    r = run_cli("store", bundle, "--answers", prompts, "--max-new-tokens", 12, "--json")
    assert r.returncode == 0, r.stderr
    assert "answers to 2 prompts" in json.loads(r.stdout)["sources"][0]
    corpus = np.load(bundle / CORPUS_FILE)
    stored = [s.tolist() for s in np.split(corpus, np.flatnonzero(corpus == -1) + 1) if s.size]
    for i, line in enumerate(["hello there", "the lazy dog"]):
        g = run_cli("generate", bundle, "--chat", line, "--max-new-tokens", 12, "--method", "none", "--json")
        ids = json.loads(g.stdout)["token_ids"]
        assert stored[i] == ids + [-1] and len(ids) >= 4, (stored[i], ids)


@pytest.mark.parametrize("case", ["missing", "empty", "vocab", "no-source", "bad-json", "not-shards"])
def test_bad_input_is_one_line_and_leaves_the_bundle_as_it_was(bundle, tmp_path, case):
    source = tmp_path / "src.jsonl"
    args = ["--from", source]
    if case == "missing":
        expected = "no such file or directory"
    elif case == "empty":
        source = tmp_path / "src.txt"
        source.write_text("\n  \n")
        args, expected = ["--from", source], "holds no text to store"
    elif case == "vocab":
        source = tmp_path / "other.npz"
        np.savez(source, corpus=np.array([5, 150_000, 7, -1], np.int32), order=np.array([0, 1, 2], np.int32))
        args, expected = ["--from", source], "token id 150000 outside the bundle's vocabulary"
    elif case == "no-source":
        args, expected = [], "give --from SOURCE, --answers PROMPTS_FILE, or both"
    elif case == "bad-json":
        source.write_text('{"text": "fine"}\n{"text": \n')
        expected = "src.jsonl:2: not JSON"
    else:
        (tmp_path / "dir").mkdir()
        args, expected = ["--from", tmp_path / "dir"], "must hold answer shards"
    before = snapshot(bundle)
    r = run_cli("store", bundle, *args)
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert snapshot(bundle) == before


def test_a_failure_while_writing_leaves_the_bundle_as_it_was(bundle, monkeypatch):
    from specrt.runtime.proposers import store_write
    from specrt.runtime.proposers.store import Datastore

    before = snapshot(bundle)

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(store_write, "_swap", boom)
    with pytest.raises(OSError, match="disk full"):
        store_write.add_to_bundle(bundle, Datastore.from_sequences([[1, 2, 3]]))
    assert snapshot(bundle) == before


def test_compile_store_refuses_a_missing_source_before_compiling(llama_target, tmp_path):
    r = run_cli("compile", "--target", llama_target, "-o", tmp_path / "none", "--store", tmp_path / "missing.txt")
    assert r.returncode == 2 and "--store" in r.stderr and "no such file" in r.stderr
    assert not (tmp_path / "none").exists()


@pytest.mark.slow  # two compiles of the toy target: ~90 s on 2 busy cores
def test_compile_store_writes_the_datastore_into_the_new_bundle(llama_target, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text(PROMPT + " and the dog sleeps\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    r = run_cli("compile", "--target", llama_target, "-o", tmp_path / "none", "--max-seq-len", 64,
                "--no-recycle-table", "--store", empty)
    assert r.returncode == 2 and "holds no text to store" in r.stderr and not (tmp_path / "none").exists()
    out = tmp_path / "b"
    r = run_cli("compile", "--target", llama_target, "-o", out, "--max-seq-len", 64, "--max-draft-tokens", 4,
                "--no-recycle-table", "--store", texts)
    assert r.returncode == 0, r.stderr
    from specrt.runtime import load
    from specrt.runtime.proposers.store import store_for

    gen = load(out, threads=1, warmup=False)
    ids = gen.tokenizer.encode(PROMPT + " and the dog sleeps", add_special_tokens=False)
    assert store_for(gen).corpus.tolist() == ids + [-1]
    _, plain = generate(out, "--method", "none")
    r, spec = generate(out, "--method", "auto", "--auto-sources", "store")
    assert r.returncode == 0 and spec["token_ids"] == plain["token_ids"], r.stderr


@pytest.mark.slow  # a compile of the toy target and ~520 short answers: ~60 s on 2 busy cores
def test_compile_store_builtin_holds_the_new_bundles_answers_to_the_packaged_prompts(llama_target, tmp_path):
    from specrt.runtime import load
    from specrt.runtime.proposers.store import store_for
    from specrt.runtime.proposers.store_sources import builtin_prompts

    out = tmp_path / "b"
    r = run_cli("compile", "--target", llama_target, "-o", out, "--max-seq-len", 64, "--max-draft-tokens", 4,
                "--no-recycle-table", "--store", "builtin")
    assert r.returncode == 0, r.stderr
    gen = load(out, threads=1, warmup=False)
    corpus = store_for(gen).corpus
    answers = int((corpus == -1).sum())
    assert 400 < answers < len(builtin_prompts())  # the prompts that fit the bundle's 64 positions, one answer each
    first = corpus[:int(np.flatnonzero(corpus == -1)[0])].tolist()
    g = run_cli("generate", out, "--chat", builtin_prompts()[0], "--max-new-tokens", len(first), "--method", "none",
                "--json")
    assert g.returncode == 0 and json.loads(g.stdout)["token_ids"] == first  # the bundle's own greedy answer
    _, plain = generate(out, "--method", "none")
    r, spec = generate(out, "--method", "auto", "--auto-sources", "store")
    assert r.returncode == 0 and spec["token_ids"] == plain["token_ids"], r.stderr


def test_shards_chats_and_exclude(target_only_bundle, tmp_path):
    """A shard directory gives the tokens past each prompt (a shard still being written is skipped); --exclude drops
    the samples whose prompt (a shard's, a conversation's user turns) holds the start of a question."""
    import os
    import time

    from specrt.runtime import load
    from specrt.runtime.proposers.store_sources import read_source

    gen = load(target_only_bundle, threads=1, warmup=False)
    enc = lambda t: gen.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"turns": ["the lazy dog sat down"]}) + "\n")
    shards = tmp_path / "shards"
    for name, age in (("shard-00000", 600), ("shard-00001", 0)):
        d = shards / name
        d.mkdir(parents=True)
        rows = [enc("the lazy dog sat down") + [5, 6, 7], enc("hello") + [8, 9]]
        np.save(d / "ids.npy", np.array(sum(rows, []), np.int64))
        np.save(d / "starts.npy", np.cumsum([0] + [len(r) for r in rows]))
        (d / "meta.json").write_text(json.dumps([{"prompt_len": len(rows[0]) - 3}, {"prompt_len": len(rows[1]) - 2}]))
        os.utime(d / "meta.json", (time.time() - age, time.time() - age))
    seqs, note = read_source(gen, shards)
    assert [s.tolist() for s in seqs] == [[5, 6, 7], [8, 9]] and "(0 excluded)" in note  # shard-00001 is too new
    seqs, note = read_source(gen, shards, questions)
    assert [s.tolist() for s in seqs] == [[8, 9]] and "(1 excluded)" in note
    chats = tmp_path / "chats.jsonl"
    chats.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                        {"role": "assistant", "content": a}]})
                               for q, a in (("the lazy dog sat down, why?", "it was tired"), ("hi", "hello"))))
    seqs, note = read_source(gen, chats, questions)
    assert [s.tolist() for s in seqs] == [enc("hello")] and "1 texts" in note and "(1 excluded)" in note


def test_answers_builtin_uses_the_packaged_prompts_less_the_excluded(bundle, tmp_path):
    """`--answers builtin`: the prompt set shipped with specrt, answered by the bundle; every `--exclude` file's
    questions are left out (a prompt held by either file is not answered)."""
    from specrt.runtime.proposers.store_sources import builtin_prompts

    prompts = builtin_prompts()
    assert len(prompts) > 500 and all(p and not p.startswith("#") for p in prompts)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(json.dumps({"turns": [prompts[0]]}) + "\n")
    second.write_text(json.dumps(prompts[3]) + "\n" + json.dumps({"prompt": prompts[7]}) + "\n")
    r = run_cli("store", bundle, "--answers", "builtin", "--max-new-tokens", 2, "--exclude", first, "--exclude", second,
                "--json")
    assert r.returncode == 0, r.stderr
    note = json.loads(r.stdout)["sources"][0]
    heads = [prompts[i][:40] for i in (0, 3, 7)]  # a prompt holding one of them is left out too
    excluded = sum(any(h in p for h in heads) for p in prompts)
    found = re.search(rf"answers to (\d+) prompts \({excluded} excluded, (\d+) too long for its --max-seq-len\)", note)
    assert found and excluded >= 3, note  # the toy bundle's --max-seq-len is 64: the longest prompts do not fit
    answered, long = int(found[1]), int(found[2])
    assert answered + long == len(prompts) - excluded and answered > 400 and long > 0
    corpus = np.load(bundle / CORPUS_FILE)
    assert int((corpus == -1).sum()) == answered
    # every prompt excluded: one line, exit 2, the datastore as it was
    everything = tmp_path / "all.jsonl"
    everything.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    before = snapshot(bundle)
    r = run_cli("store", bundle, "--answers", "builtin", "--exclude", everything)
    assert r.returncode == 2 and r.stderr.strip() == "error: no prompt is left after --exclude: nothing to store", r.stderr
    assert snapshot(bundle) == before
