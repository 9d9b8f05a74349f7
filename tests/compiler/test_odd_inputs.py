"""Real but odd checkpoint directories given to `specrt compile`: each is refused with one line naming the file or
field, exit 2, before anything is exported and with nothing written (it was exit 1 and a Python exception's
name and message, or an error that blamed the output for an input's file)."""

from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import run_cli

from specrt.compiler.os_errors import compile_os_error
from specrt.core.errors import CheckpointError, InvalidArgument


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    fn(data)
    path.write_text(json.dumps(data))


def sharded_index(ck: Path, text: str | bytes) -> None:
    index = ck / "model.safetensors.index.json"
    index.write_bytes(text if isinstance(text, bytes) else text.encode())


def directory_in_place(ck: Path, name: str) -> None:
    (ck / name).unlink(missing_ok=True)
    (ck / name).mkdir()


CASES = {
    # the safetensors index: a JSON list, bytes that are not UTF-8, a directory
    "index_a_list": (lambda ck: sharded_index(ck, "[]"), r"model\.safetensors\.index\.json must hold a JSON object"),
    "index_not_utf8": (lambda ck: sharded_index(ck, b"\xff\xfe{}"), r"index\.json is not valid UTF-8 JSON"),
    "index_a_directory": (lambda ck: directory_in_place(ck, "model.safetensors.index.json"),
                          r"model\.safetensors\.index\.json is not a regular file"),
    # config.json fields of the wrong type
    "architectures_a_string": (lambda ck: edit_json(ck / "config.json", lambda c: c.update(
        architectures="LlamaForCausalLM")), r"architectures must be a list of class names"),
    "architectures_of_numbers": (lambda ck: edit_json(ck / "config.json", lambda c: c.update(architectures=[1])),
                                 r"architectures must be a list of class names.*\[1\]"),
    "tie_word_embeddings_a_string": (lambda ck: edit_json(ck / "config.json", lambda c: c.update(
        tie_word_embeddings="False")), r"tie_word_embeddings must be true or false, got 'False'"),
    "attention_bias_a_string": (lambda ck: edit_json(ck / "config.json", lambda c: c.update(attention_bias="false")),
                                r"attention_bias must be true or false"),
    "eos_a_float": (lambda ck: edit_json(ck / "generation_config.json", lambda c: c.update(eos_token_id=2.7)),
                    r"eos_token_id must be a token id or a list of token ids, got 2\.7"),
    "eos_a_word": (lambda ck: edit_json(ck / "generation_config.json", lambda c: c.update(eos_token_id="x")),
                   r"eos_token_id must be a token id"),
    "eos_digits_as_text": (lambda ck: edit_json(ck / "generation_config.json", lambda c: c.update(
        eos_token_id=["2"])), r"eos_token_id must be a token id"),
    # rope values that gave NaN logits, found only by the validation after a whole export (exit 1)
    "rope_theta_zero": (lambda ck: edit_json(ck / "config.json", lambda c: c["rope_parameters"].update(rope_theta=0)),
                        r"rope_theta must be a positive number, got 0\.0"),
    "linear_factor_negative": (lambda ck: edit_json(ck / "config.json", lambda c: c["rope_parameters"].update(
        rope_type="linear", factor=-2)), r"the rope scaling factor must be a positive number, got -2\.0"),
    # a tokenizer of another (larger) model
    "tokenizer_past_the_vocabulary": (lambda ck: edit_json(ck / "config.json", lambda c: c.update(vocab_size=100)),
                                      r"tokenizer\.json holds token ids up to \d+, but the target's config\.json "
                                      r"has vocab_size 100"),
    # tokenizer_config.json and chat_template.jinja the runtime could not read
    "tokenizer_config_a_list": (lambda ck: (ck / "tokenizer_config.json").write_text("[]"),
                                r"tokenizer_config\.json must hold a JSON object"),
    "tokenizer_config_not_utf8": (lambda ck: (ck / "tokenizer_config.json").write_bytes(b"\xff{}"),
                                  r"tokenizer_config\.json is not valid UTF-8 JSON"),
    "chat_template_a_number": (lambda ck: edit_json(ck / "tokenizer_config.json", lambda c: c.update(chat_template=5)),
                               r"chat_template must be a Jinja template \(a string\) or a list"),
    "chat_template_list_of_numbers": (lambda ck: edit_json(ck / "tokenizer_config.json", lambda c: c.update(
        chat_template=[1, 2])), r"chat_template must be a Jinja template"),
    "chat_template_jinja_not_utf8": (lambda ck: (ck / "chat_template.jinja").write_bytes(b"\xff{{ messages }}"),
                                     r"chat_template\.jinja is not UTF-8 text"),
    # a directory where the compile reads (or copies) a file: was blamed on the output, after the export
    "special_tokens_map_a_directory": (lambda ck: directory_in_place(ck, "special_tokens_map.json"),
                                       r"special_tokens_map\.json is not a regular file"),
    "chat_template_jinja_a_directory": (lambda ck: directory_in_place(ck, "chat_template.jinja"),
                                        r"chat_template\.jinja is not a regular file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_odd_checkpoint_files_are_one_line_exit_2_and_nothing_written(tmp_path, llama_target, case):
    make, expected = CASES[case]
    ck = Path(shutil.copytree(llama_target, tmp_path / "ck"))
    make(ck)
    r = run_cli("compile", "--target", ck, "-o", tmp_path / "out", "--max-seq-len", 64, "--max-draft-tokens", 4)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "cannot write output" not in r.stderr and "export" not in r.stderr, r.stderr
    assert re.search(expected, r.stderr), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no output, no temporary


def test_a_directory_holding_a_gguf_file_points_at_the_file(tmp_path):
    folder = tmp_path / "Qwen-GGUF"
    folder.mkdir()
    (folder / "qwen2.5-0.5b-q8_0.gguf").write_bytes(b"GGUF")
    r = run_cli("compile", "--target", folder, "-o", tmp_path / "out")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "it holds qwen2.5-0.5b-q8_0.gguf: pass that file itself as --target" in r.stderr


def test_os_errors_name_the_side_they_came_from(tmp_path):
    """An OS error during a compile blames the output only when its file is the output or the temporary sibling
    (or the disk is full); an input's file is named as unreadable; a short write without errno (numpy's tofile on
    a full disk, under the ONNX writer) is a full-disk output error, not `OSError: 8192 requested and ...`."""
    out = tmp_path / "bundle"
    own = compile_os_error(OSError(errno.EISDIR, "Is a directory", str(tmp_path / ".bundle.tmp-x1y2" / "a.json")), out)
    assert isinstance(own, InvalidArgument) and str(own) == f"cannot write output {out}: Is a directory"
    ck_file = tmp_path / "ck" / "special_tokens_map.json"
    theirs = compile_os_error(IsADirectoryError(errno.EISDIR, "Is a directory", str(ck_file)), out)
    assert isinstance(theirs, CheckpointError) and str(theirs) == f"cannot read {ck_file}: Is a directory"
    full = compile_os_error(OSError(errno.ENOSPC, "No space left on device", str(out / "target" / "model.onnx")), out)
    assert isinstance(full, InvalidArgument) and str(full) == f"cannot write output {out}: No space left on device"
    other = compile_os_error(OSError(errno.ENOSPC, "No space left on device", "/scratch/x.onnx"), out)
    assert isinstance(other, InvalidArgument) and str(other).startswith("cannot write /scratch/x.onnx while compiling")
    short = compile_os_error(OSError("8192 requested and 2048 written"), out)
    assert isinstance(short, InvalidArgument) and "is the disk full?" in str(short)
    assert compile_os_error(OSError("could not get source code"), out) is None  # not ours to explain: re-raised


@pytest.mark.slow  # exports the target first (~10 s without the session's export cache)
def test_a_full_disk_while_writing_a_graph_is_one_line(tmp_path, llama_target, monkeypatch):
    """The graph writer's short write (what a full disk gave: `OSError: 8192 requested and 2048 written`, exit 1)."""
    def disk_full(path):
        raise OSError("8192 requested and 2048 written")

    monkeypatch.setattr("specrt.compiler.pipeline.clean_portable_graph", disk_full)
    r = run_cli("compile", "--target", llama_target, "-o", tmp_path / "out", "--max-seq-len", 64)
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]  # after the steps' progress lines
    assert r.returncode == 2 and len(errors) == 1 and errors[0].startswith("error: ") and "Traceback" not in r.stderr
    assert f"cannot write output {tmp_path / 'out'}: a write was cut short" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["-o", "--target"])
def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path, llama_target, flag):
    """Path.exists() raises ENAMETOOLONG (Python 3.11): was `OSError: [Errno 36] File name too long` (exit 1)."""
    long = tmp_path / ("x" * 300)
    args = {"-o": ("--target", llama_target, "-o", long), "--target": ("--target", long, "-o", tmp_path / "out")}[flag]
    r = run_cli("compile", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "File name too long" in r.stderr and "OSError" not in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_named_templates_as_a_mapping_are_accepted(tmp_path):
    """transformers reads `chat_template` as text, a list of {"name", "template"} or a {name: template} mapping."""
    from specrt.compiler.tokenizer_check import check_chat_template

    for ok in ("{{ messages }}", [{"name": "default", "template": "x"}], {"default": "x", "tool_use": "y"}, None):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": ok}))
        check_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": {"default": 5}}))
    with pytest.raises(CheckpointError, match="chat_template must be"):
        check_chat_template(tmp_path)
