"""The CLI as a user runs it: exit codes, one-line errors, no tracebacks. Most cases run in-process
(click's CliRunner: the same code path after argument parsing, no new interpreter); a real `python -m specrt`
process checks the entry point, the exit code and the one-line stderr end to end."""

import json
import subprocess
import sys

import pytest

from helpers import run_cli


def check_code(proc, check):
    if check is not None:
        assert proc.returncode == check, proc.stderr
    return proc


def specrt(*args, check=None):
    return check_code(run_cli(*args), check)


def specrt_process(*args, check=None):
    proc = subprocess.run([sys.executable, "-m", "specrt", *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    return check_code(proc, check)


def test_generate_json(pair_bundle, pair_generator):
    proc = specrt_process("generate", pair_bundle, "--prompt", "import os", "--max-new-tokens", 12,
                  "--method", "draft", "--num-speculative-tokens", 3, "--json", check=0)
    out = json.loads(proc.stdout)
    assert set(out) == {"text", "token_ids", "finish_reason", "stats"}
    expected = pair_generator.generate("import os", 12, method="none")
    assert out["token_ids"] == expected.token_ids and out["text"] == expected.text
    for key in ("method", "num_speculative_tokens", "new_tokens", "drafted_tokens", "accepted_tokens",
                "acceptance_rate", "mean_accepted_tokens", "accepted_histogram", "target_calls", "draft_calls",
                "draft_seconds", "verify_seconds", "elapsed_s", "tokens_per_second"):
        assert key in out["stats"], key
    assert out["stats"]["method"] == "draft" and out["stats"]["drafted_tokens"] > 0


def test_generate_stream_and_plain_text(pair_bundle, pair_generator):
    expected = pair_generator.generate("import os", 12, method="none").text
    proc = specrt("generate", pair_bundle, "--prompt", "import os", "--max-new-tokens", 12, "--stream",
                  "--num-speculative-tokens", 2, check=0)
    assert proc.stdout == expected + "\n"
    proc = specrt("generate", pair_bundle, "--prompt", "import os", "--max-new-tokens", 12, check=0)
    assert proc.stdout == expected + "\n" and "acceptance" in proc.stderr


def test_inspect_json(pair_bundle):
    out = json.loads(specrt("inspect", pair_bundle, "--json", check=0).stdout)
    assert set(out["models"]) == {"target", "draft"} and out["checksums"] == "ok"
    assert out["max_seq_len"] == 128


@pytest.mark.parametrize("args, code, message", [
    (["generate", "{b}", "--prompt", "hi", "--num-speculative-tokens", "-1"], 2, "must be >= 0 or 'auto', got -1"),
    (["generate", "{b}", "--prompt", "hi", "--num-speculative-tokens", "99"], 2, "outside [0, 8]"),
    (["generate", "{b}", "--prompt", "hi", "--temperature", "-1"], 2, "temperature must be >= 0"),
    (["generate", "{b}", "--prompt", "hi", "--top-p", "0"], 2, "--top-p must be in (0, 1]"),
    (["generate", "{b}", "--prompt", "hi", "--max-new-tokens", "0"], 2, "--max-new-tokens must be"),
    (["generate", "{b}", "--prompt", "x " * 300], 2, "max_seq_len=128"),
    (["generate", "{b}/nope", "--prompt", "hi"], 2, "does not exist"),
    (["generate", "{b}", "--prompt", "hi", "--num-speculative-tokens", "lots"], 2, "must be an integer or 'auto'"),
    (["compile", "--target", "{b}/nope", "-o", "{b}2"], 2, "no such directory"),
    (["compile", "--target", "{t}", "-o", "{b}"], 2, "--force"),
])
def test_errors_are_one_line_with_exit_code(pair_bundle, llama_target, args, code, message):
    args = [a.format(b=pair_bundle, t=llama_target) for a in args]
    proc = specrt(*args)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_real_process_errors_in_one_line():
    """The entry point itself: a usage error and a bad bundle, each one stderr line and exit 2."""
    for args, message in ((["generate", "--bogus"], "No such option"),
                          (["generate", "/nonexistent-bundle", "--prompt", "hi"], "does not exist")):
        proc = specrt_process(*args)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_compile_cli_writes_bundle(tmp_path, llama_target, llama_draft):
    out = tmp_path / "b"
    proc = specrt("compile", "--target", llama_target, "--draft", llama_draft, "-o", out, "--max-seq-len", 64,
                  "--max-draft-tokens", 4, "--json", check=0)
    summary = json.loads(proc.stdout)
    assert summary["max_draft_tokens"] == 4 and (out / "manifest.json").exists()
    proc = specrt("compile", "--target", llama_target, "-o", out, "--max-seq-len", 64, "--force", check=0)
    assert "wrote bundle" in proc.stdout
    assert json.loads((out / "manifest.json").read_text())["models"].keys() == {"target"}


def test_packaging_installs_only_namespaced_packages():
    """No bare `compiler` / `runtime` package in site-packages: every package is specrt.* (the packages themselves are
    discovered by setup.py; tests/test_wheel.py checks the built wheel)."""
    import tomllib
    from pathlib import Path

    cfg = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" not in cfg  # listed by hand, a new folder was once forgotten
    assert cfg["package-dir"]["specrt.compiler"] == "compiler" and cfg["package-dir"]["specrt.runtime"] == "runtime"
    deps = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("onnxruntime", "transformers")) for d in deps["dependencies"])
    cpu = deps["optional-dependencies"]["cpu"]
    assert "onnxruntime>=1.20" in cpu and not any(d.startswith("onnxruntime-gpu") for d in cpu)
    assert any(d.startswith("onnxruntime-gpu") for d in deps["optional-dependencies"]["gpu"])
