"""Issue 26 (CLI): repeated options, non-UTF-8 text, out-of-vocabulary EOS, a closed pipe."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specrt.bundle.manifest import read_manifest
from specrt.cli.main import main
from specrt.core.errors import ManifestError


def one_line_exit_2(res, *words):
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output, res.output
    for w in words:
        assert w in res.output, res.output


def test_repeated_single_valued_option_is_refused(tmp_path, llama_target):
    res = CliRunner().invoke(main, ["compile", "--target", str(llama_target), "--draft", "self:int4", "--draft",
                                    str(llama_target), "-o", str(tmp_path / "b")])
    one_line_exit_2(res, "--draft given more than once")
    assert not (tmp_path / "b").exists()


def test_repeated_multiple_option_still_works(tmp_path):
    res = CliRunner().invoke(main, ["distill-draft", "--target", str(tmp_path / "none"), "--data", "a", "--data", "b",
                                    "-o", str(tmp_path / "o")])
    assert "more than once" not in res.output


@pytest.mark.parametrize("flag", ["--chat", "--system"])
def test_non_utf8_chat_is_one_line(pair_bundle, flag):
    args = ["generate", str(pair_bundle), "--chat", "hi\udcff" if flag == "--chat" else "hi"]
    if flag == "--system":
        args += ["--system", "sys\udcfe"]
    res = CliRunner().invoke(main, args)
    one_line_exit_2(res, flag, "not valid Unicode")


@pytest.mark.parametrize("key", ["tokenizer", "target"])
def test_eos_outside_the_vocabulary_is_refused(tmp_path, pair_bundle, key):
    b = Path(shutil.copytree(pair_bundle, tmp_path / "b"))
    m = json.loads((b / "manifest.json").read_text())
    entry = m["tokenizer"] if key == "tokenizer" else m["models"]["target"]
    entry["eos_token_ids"] = [10**6]
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="outside the .*vocabulary"):
        read_manifest(b)


@pytest.mark.parametrize("threads", ["0", "-1", "100000"])
def test_generate_threads_are_bounded(pair_bundle, threads):
    res = CliRunner().invoke(main, ["generate", str(pair_bundle), "--prompt", "x", "--threads", threads])
    one_line_exit_2(res, "threads")


def test_closed_pipe_exits_quietly(pair_bundle):
    """`specrt generate ... | head -c 0`: no BrokenPipeError traceback, the SIGPIPE status."""
    proc = subprocess.Popen([sys.executable, "-m", "specrt", "generate", str(pair_bundle), "--prompt", "import os",
                             "--max-new-tokens", "60", "--stream", "--method", "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first token is written
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
    assert proc.returncode == 141, (proc.returncode, err)
