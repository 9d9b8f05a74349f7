"""Files named on the command line (core/textfile.py, issue 49): only regular files, only up to a cap, one clear
line and exit 2 otherwise (`/dev/zero` grew to 11-22 GB, a FIFO hung); schemas, grammars and .jsonl lines too
deep for the parser (RecursionError, or a crash in llguidance's compiler) and empty prompts refused the same way."""

from __future__ import annotations

import json
import os
import time

import pytest

from helpers import run_cli
from specrt.core.errors import InvalidArgument
from specrt.core.textfile import read_user_text


def test_only_regular_files_up_to_the_cap(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    with pytest.raises(InvalidArgument, match=r"--x .*fifo is a FIFO; give a regular text file"):
        read_user_text(fifo, "--x", 100)  # opened without waiting for a writer
    assert time.perf_counter() - t0 < 5
    with pytest.raises(InvalidArgument, match="/dev/zero is a character device"):
        read_user_text("/dev/zero", "--x", 100)
    with pytest.raises(InvalidArgument, match="is a directory"):
        read_user_text(tmp_path, "--x", 100)
    big = tmp_path / "big.txt"
    big.write_text("a" * 101)
    with pytest.raises(InvalidArgument, match="is 101 bytes; the limit is 100 bytes"):
        read_user_text(big, "--x", 100)
    assert read_user_text(big, "--x", 101) == "a" * 101
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9")
    with pytest.raises(InvalidArgument, match="is not UTF-8 text"):
        read_user_text(tmp_path / "latin.txt", "--x", 100)
    with pytest.raises(InvalidArgument, match="cannot read --x .*missing: no such file"):
        read_user_text(tmp_path / "missing", "--x", 100)


def _fails_in_one_line(r, message: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-800:])
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr[-800:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_generate_refuses_devices_fifos_and_oversized_files(pair_bundle, tmp_path):
    fifo = tmp_path / "schema.fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"enum": ["x" * 300_000]}))
    for args, message in [(["--prompts-file", "/dev/zero"], "/dev/zero is a character device"),
                          (["--prompt", "x", "--json-schema", "/dev/zero"], "/dev/zero is a character device"),
                          (["--prompt", "x", "--json-schema", fifo], "is a FIFO"),
                          (["--prompt", "x", "--grammar", fifo], "is a FIFO"),
                          (["--prompt", "x", "--json-schema", big], "the limit is 262,144 bytes")]:
        _fails_in_one_line(run_cli("generate", pair_bundle, "--max-new-tokens", 2, *args), message)


def test_generate_refuses_what_crashed_or_recursed(pair_bundle, tmp_path):
    deep = tmp_path / "deep.json"  # json.loads: RecursionError before
    deep.write_text("[" * 100_000 + "]" * 100_000)
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(1000)}
    defs["d1000"] = {"type": "integer"}
    chain = tmp_path / "chain.json"  # llguidance's compiler: SIGSEGV (exit 139) before
    chain.write_text(json.dumps({"$defs": defs, "$ref": "#/$defs/d0"}))
    rules = tmp_path / "rules.lark"  # 3000 chained rules: SIGSEGV before
    rules.write_text("\n".join(["start: r0"] + [f'r{i}: "a" r{i + 1}' for i in range(3000)] + ['r3000: "b"']))
    for args, message in [(["--json-schema", deep], "nests deeper than 128 levels"),
                          (["--json-schema", chain], "through its $refs; the limit is 1000"),
                          (["--grammar", rules], "defines 3002 rules; the limit is 1000")]:
        _fails_in_one_line(run_cli("generate", pair_bundle, "--prompt", "x", "--max-new-tokens", 2, *args), message)


@pytest.mark.parametrize("line, message", [
    ("[" * 100_000 + "]" * 100_000, ":2: nested too deeply"),
    (json.dumps(""), ':2: the prompt is empty'),
    (json.dumps({"prompt": ""}), ':2: "prompt" is empty'),
])
def test_prompts_file_lines_too_deep_or_empty(pair_bundle, tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps("hello") + "\n" + line + "\n", encoding="utf-8")
    r = run_cli("generate", pair_bundle, "--prompts-file", path, "--max-new-tokens", 2)
    _fails_in_one_line(r, f"{path}{message}")
    assert r.stdout == ""
