"""`--method recycle` on the command line: a choice of the shared --method option (it follows the registry),
output equal to plain; `specrt compile`'s table options fail with one line before anything is compiled."""

import json

from helpers import run_cli

PROMPT = "one two three four one two three four one two"


def test_generate_recycle_equals_plain(target_only_bundle):
    plain = run_cli("generate", target_only_bundle, "--prompt", PROMPT, "--max-new-tokens", 24, "--method", "none",
                    "--json")
    spec = run_cli("generate", target_only_bundle, "--prompt", PROMPT, "--max-new-tokens", 24, "--method", "recycle",
                   "--json")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    out = json.loads(spec.stdout)
    assert out["token_ids"] == json.loads(plain.stdout)["token_ids"] and out["stats"]["method"] == "recycle"


def test_compile_table_options_are_checked_first(llama_target, tmp_path):
    r = run_cli("compile", "--target", llama_target, "-o", tmp_path / "b", "--recycle-prompts", tmp_path / "none.txt")
    assert r.returncode != 0 and "cannot read --recycle-prompts file" in r.stderr and "Traceback" not in r.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    r = run_cli("compile", "--target", llama_target, "-o", tmp_path / "b", "--recycle-prompts", empty)
    assert r.returncode != 0 and "holds no prompts" in r.stderr
    r = run_cli("compile", "--target", llama_target, "-o", tmp_path / "b", "--recycle-prompts", empty,
                "--no-recycle-table")
    assert r.returncode != 0 and "--no-recycle-table" in r.stderr
    assert not (tmp_path / "b").exists()
