"""`specrt generate BUNDLE --prompts-file FILE`: many prompts decoded together on the batching scheduler, one JSON
line per prompt in the file's order, each equal to that prompt generated alone; a bad file is a one-line error
with exit 2 before anything loads."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli

PROMPTS = ["hello world", "def f(x): return x + 1\ndef g(x): return", "a b a b a b a b a b", "the quick brown fox",
           "import os\nimport sys\n"]


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("max_batch", ["3", "0"])
def test_every_line_equals_the_prompt_alone(pair_bundle, pair_generator, tmp_path, max_batch):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:3])
                    + json.dumps({"prompt": PROMPTS[3]}) + "\n\n" + json.dumps({"chat": "Say hi", "system": "Be brief"})
                    + "\n", encoding="utf-8")
    r = run_cli("generate", pair_bundle, "--prompts-file", path, "--max-new-tokens", 10, "--max-batch", max_batch,
                "--method", "ngram", "--temperature", 0, "--backend", "ort")
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert [o["index"] for o in out] == list(range(5))
    from specrt.runtime.chat_template import chat_prompt_ids

    refs = PROMPTS[:4] + [chat_prompt_ids(pair_generator, "Say hi", "Be brief")]
    for o, p in zip(out, refs):
        alone = pair_generator.generate(p, 10, method="ngram", temperature=0)
        assert o["token_ids"] == alone.token_ids and o["text"] == alone.text
        assert o["finish_reason"] == alone.finish_reason and o["stats"]["new_tokens"] == len(alone.token_ids)
    how = "batches of up to 3" if max_batch == "3" else "one at a time"
    assert f"5 prompts, {sum(len(o['token_ids']) for o in out)} tokens" in r.stderr and how in r.stderr


def test_a_text_file_is_one_prompt_per_line(pair_bundle, pair_generator, tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello world\n\nthe quick brown fox\n", encoding="utf-8")
    r = run_cli("generate", pair_bundle, "--prompts-file", path, "--max-new-tokens", 6, "--method", "none",
                "--temperature", 0, "--backend", "ort")
    assert r.returncode == 0, r.stderr
    out = _lines(r.stdout)
    assert [o["token_ids"] for o in out] == [pair_generator.generate(p, 6, method="none", temperature=0).token_ids
                                             for p in ("hello world", "the quick brown fox")]


@pytest.mark.parametrize("content,message", [
    ('"ok"\n{"prompt": 3}\n', ':2: "prompt" must be a string'),
    ('"ok"\nnot json\n', ":2: not JSON"),
    ('{"prompt": "a", "chat": "b"}\n', 'exactly one of "prompt" and "chat"'),
    ('{"text": "a"}\n', "unknown key(s) text"),
    ('[1, 2]\n', "got list"),
    ("\n\n", "has no prompts"),
])
def test_a_bad_file_is_a_clear_error(pair_bundle, tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    r = run_cli("generate", pair_bundle, "--prompts-file", path, "--max-new-tokens", 4)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


def test_prompts_file_excludes_the_single_prompt_options(pair_bundle, tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("hi\n", encoding="utf-8")
    for extra in (["--prompt", "x"], ["--stream"], ["--system", "s"]):
        r = run_cli("generate", pair_bundle, "--prompts-file", path, *extra)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    r = run_cli("generate", pair_bundle, "--prompts-file", tmp_path / "missing.txt")
    assert r.returncode == 2 and "cannot read --prompts-file" in r.stderr


@pytest.mark.parametrize("max_batch", ["3", "0"])
def test_a_bad_prompt_names_its_line_and_strict_holds_on_the_batch(pair_bundle, tmp_path, max_batch):
    # the toy bundle's context is 128 tokens: a prompt of 200 ids is too long, one of 120 leaves 8 new tokens
    long_ids = " ".join(["7"] * 200)
    path = tmp_path / "p.txt"
    path.write_text(f"hello world\n\n{long_ids}\nx\n", encoding="utf-8")
    r = run_cli("generate", pair_bundle, "--prompts-file", path, "--max-new-tokens", 4, "--max-batch", max_batch)
    assert r.returncode == 2 and f"{path}:3: prompt has" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""  # checked before anything runs
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps("hello world") + "\n" + json.dumps({"prompt": "a " * 118}) + "\n", encoding="utf-8")
    r = run_cli("generate", pair_bundle, "--prompts-file", path, "--max-new-tokens", 24, "--max-batch", max_batch,
                "--method", "none", "--strict")
    assert r.returncode == 2 and f"{path}:2: prompt has" in r.stderr and "exceeds" in r.stderr, r.stderr
    r = run_cli("generate", pair_bundle, "--prompts-file", path, "--max-new-tokens", 24, "--max-batch", max_batch,
                "--method", "none", "--temperature", 0)
    assert r.returncode == 0, r.stderr
    assert f"{path}:2: warning: stopped at the bundle's context of 128 tokens" in r.stderr
    assert f"{path}:1: warning" not in r.stderr


def test_a_small_file_runs_one_at_a_time_under_auto_and_a_large_one_batches(pair_bundle, tmp_path, monkeypatch):
    """Issue 49 #11: 2 prompts x 16 tokens took 5.2 s batched against 3.0 s one at a time (the engine's start-up:
    its cost table measured on first use, its packed session). Under --max-batch auto a file too small to pay that
    back runs one at a time; an explicit --max-batch is honoured."""
    from specrt.cli.generate_batch import batching_pays, run_file
    from specrt.runtime import load
    from specrt.runtime.batch import costs

    monkeypatch.setenv("SPECRT_REMEASURE", "1")  # the table counts as not cached: start-up = measuring it
    gen = load(pair_bundle, backend="ort")
    step = costs.step_seconds(gen)
    assert costs.startup_seconds(gen, 2) == pytest.approx(
        costs.PACKED_START_S + (costs.STARTUP_STEPS_MEASURE + 2 * costs.STARTUP_STEPS_PER_SLOT) * step)
    assert not batching_pays(gen, 2, 16, 2)
    assert batching_pays(gen, 200_000, 128, 8)  # ~11 s saved at 0.1 ms a step
    results, _, batch = run_file(gen, PROMPTS[:2], "auto", 6, {"method": "none"})
    assert batch == 0 and all(r.token_ids for r in results)
    results, _, batch = run_file(gen, PROMPTS[:2], 2, 6, {"method": "none"})
    assert batch == 2
