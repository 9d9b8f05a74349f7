"""`specrt generate --prompts-file`: the prefix cache is on by default (a prompt admitted after another with the same
head was prefilled reuses its rows: stats.cached_tokens), `--no-prefix-cache` turns it off; the output is the same."""

from __future__ import annotations

import json

from helpers import run_cli

HEAD = "def parse(path):\n    with open(path) as f:\n        return json.load(f)\n"


def test_prompts_sharing_a_head_reuse_it_unless_turned_off(pair_bundle, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(HEAD + tail) + "\n" for tail in ("x = 1", "y = 2", "z = 3")), encoding="utf-8")
    runs = {}
    for extra in ([], ["--no-prefix-cache"]):
        # --max-batch 1 would run one at a time without the engine: 2 slots, so the third prompt is admitted after
        # the first two were prefilled
        r = run_cli("generate", pair_bundle, "--prompts-file", path, "--max-new-tokens", 6, "--max-batch", 2,
                    "--method", "none", "--temperature", 0, "--backend", "ort", *extra)
        assert r.returncode == 0, r.stderr
        runs[bool(extra)] = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    on, off = runs[False], runs[True]
    assert [o["token_ids"] for o in on] == [o["token_ids"] for o in off]
    assert on[2]["stats"]["cached_tokens"] >= 32 and on[0]["stats"]["cached_tokens"] == 0
    assert all(o["stats"]["cached_tokens"] == 0 for o in off)


def test_a_negative_budget_is_a_usage_error(pair_bundle, tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("hello\n", encoding="utf-8")
    r = run_cli("generate", pair_bundle, "--prompts-file", path, "--prefix-cache-mb", -1)
    assert r.returncode == 2 and "-1" in r.stderr and "Traceback" not in r.stderr
