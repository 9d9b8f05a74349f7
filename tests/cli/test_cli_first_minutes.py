"""What a newcomer sees (issue 15): consistent stats lines, the context limit, flag names in errors, one
error prefix, compile errors that guide. The CLI in-process on the tiny fixture bundles (max_seq_len 128)."""

import json
import re
import shutil

import pytest
from helpers import run_cli


specrt = run_cli  # in-process (tests/helpers.py); tests/cli/test_cli.py runs the real entry point


STATS = re.compile(r"\[(draft|ngram|none|auto), (k=\d+|k=0 at the end \(speculation off: .*\)), \d+ tokens, "
                   r"[\d.]+ tok/s, (acceptance [\d.]+ \(\d+/\d+ drafted tokens\), mean accepted [\d.]+|"
                   r"no tokens drafted)(, [\w-]+ \d+ steps \([^)]*\))*, finish_reason (length|stop), backend \w+\]")


def test_stream_prints_the_same_stats_line(pair_bundle):
    lines = []
    for extra in ([], ["--stream"]):
        proc = specrt("generate", pair_bundle, "--prompt", "import os", "--max-new-tokens", 8, "--method", "draft",
                      "--num-speculative-tokens", 2, *extra)  # draft: its k does not depend on timings (auto's may)
        assert proc.returncode == 0, proc.stderr
        assert STATS.fullmatch(proc.stderr.strip()), proc.stderr
        lines.append(proc.stderr.split(" tokens,")[0])
    assert lines[0] == lines[1]


def long_prompt(generator, tokens: int) -> str:
    text = "import os\n"
    while len(generator.tokenizer.encode(text)) < tokens:
        text += "x = os.path.join(a, b)\n"
    return text


def test_context_limit_warns_or_refuses_consistently(pair_bundle, pair_generator):
    prompt = long_prompt(pair_generator, 110)
    n = len(pair_generator.tokenizer.encode(prompt))
    room = 128 - n
    proc = specrt("generate", pair_bundle, "--prompt", prompt, "--max-new-tokens", 50, "--method", "none", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["finish_reason"] == "length" and len(out["token_ids"]) == room
    assert out["stats"]["context_limited"] is True
    assert proc.stderr.strip() == (f"warning: stopped at the bundle's context of 128 tokens: {room} of "
                                   f"--max-new-tokens 50 generated after a {n}-token prompt "
                                   "(finish_reason length; --strict makes this an error)")
    proc = specrt("generate", pair_bundle, "--prompt", prompt, "--max-new-tokens", 50, "--strict")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: prompt has {n} tokens: with --max-new-tokens=50 it exceeds the bundle's "
                           f"context of 128 tokens (at most {room} new tokens fit)\n")
    # the Python API: the same error with strict=True, finish_reason "length" otherwise
    from specrt.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="max_new_tokens=50 it exceeds"):
        pair_generator.generate(prompt, 50, strict=True)
    res = pair_generator.generate(prompt, 50, method="none")
    assert res.finish_reason == "length" and res.stats.context_limited and len(res.token_ids) == room
    res = pair_generator.generate(prompt, room, method="none")
    assert not res.stats.context_limited


@pytest.mark.parametrize("args, message", [
    (["--max-new-tokens", 0], "error: --max-new-tokens must be an integer >= 1, got 0"),
    (["--num-speculative-tokens", 9], "error: --num-speculative-tokens=9 is outside [0, 8]"),
    (["--top-p", 0], "error: --top-p"),
    (["--method", "bogus"], "error: Invalid value for '--method'"),
    (["--bogus-flag"], "error: No such option '--bogus-flag'"),
])
def test_errors_name_flags_with_one_prefix(pair_bundle, args, message):
    proc = specrt("generate", pair_bundle, "--prompt", "x", *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert "Error:" not in proc.stderr and "Usage:" not in proc.stderr and "_" not in proc.stderr.split(":")[1]


def test_compile_errors_guide(tmp_path, pair_bundle, llama_target):
    (tmp_path / "notes").mkdir()
    (tmp_path / "heads").mkdir()
    (tmp_path / "heads" / "medusa_config.json").write_text("{}")
    cases = [
        (["--target", tmp_path / "notes"], "--target", "not a checkpoint directory (config.json and tokenizer.json "
                                                       "missing); a Hugging Face checkpoint directory needs"),
        (["--target", pair_bundle], "--target", "is a compiled specrt bundle, not a checkpoint"),
        (["--target", llama_target, "--draft", pair_bundle], "--draft", "is a compiled specrt bundle"),
        (["--target", llama_target, "--draft", tmp_path / "heads"], "--draft", "holds Medusa heads, not a checkpoint: "
                                                                              "pass it as --medusa"),
        (["--target", llama_target, "--medusa", llama_target], "--medusa", "has no medusa_config.json"),
        (["--target", tmp_path / "missing"], "--target", "no such directory"),
    ]
    for args, flag, message in cases:
        proc = specrt("compile", *args, "-o", tmp_path / "out")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"error: {flag} ") and message in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1  # one line, no empty line before it
    assert not (tmp_path / "out").exists()
    # an error found inside the compile (after the progress display was set up): still one line, no empty line
    (tmp_path / "foo").mkdir()
    (tmp_path / "foo" / "config.json").write_text('{"architectures": ["FooForCausalLM"], "model_type": "foo"}')
    shutil.copy(llama_target / "tokenizer.json", tmp_path / "foo" / "tokenizer.json")
    proc = specrt("compile", "--target", tmp_path / "foo", "-o", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.startswith("error: unsupported architecture FooForCausalLM")
    assert proc.stderr.count("\n") == 1


def test_adaptive_off_says_why(pair_bundle):
    """The unrelated draft is almost never accepted: the adaptive policy switches itself off and says so."""
    proc = specrt("generate", pair_bundle, "--prompt", "import os", "--max-new-tokens", 48, "--method", "draft")
    assert proc.returncode == 0, proc.stderr
    line = proc.stderr.strip()
    assert STATS.fullmatch(line), line
    assert (", k=0 at the end (speculation off: drafting is slower than plain decoding here, by the controller's "
            "estimates (per-token acceptance 0.") in line


def test_no_command_prints_the_help_not_an_error():
    proc = specrt()
    assert proc.stdout.startswith("Usage: specrt") or proc.stderr.startswith("Usage: specrt")
    assert "error:" not in proc.stdout + proc.stderr
