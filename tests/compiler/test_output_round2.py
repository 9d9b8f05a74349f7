"""Issue 26 (compile and recipes): permissions follow the umask, `-o ..` from inside a bundle, options that
would be ignored, empty calibration text, truncated resume files."""

import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from specrt.cli.main import main
from specrt.compiler.output_dir import HF_CHECKPOINT, staged_output
from specrt.core.errors import CheckpointError


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def one_line_exit_2(res, *words):
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output, res.output
    for w in words:
        assert w in res.output, res.output


def test_outputs_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with staged_output(tmp_path / "out", False, (), HF_CHECKPOINT) as tmp:
            (tmp / "config.json").write_text("{}")
    finally:
        os.umask(old)
    assert mode(tmp_path / "out") == 0o755 and mode(tmp_path / "out" / "config.json") == 0o644


def test_compiled_bundle_follows_the_umask(pair_bundle):
    mask = os.umask(0)
    os.umask(mask)
    assert mode(pair_bundle) == 0o777 & ~mask
    assert mode(pair_bundle / "target" / "model.onnx.data") == 0o666 & ~mask


def test_parent_of_the_current_bundle_as_output(tmp_path, pair_bundle, llama_target, monkeypatch):
    home = tmp_path / "home"
    b = Path(shutil.copytree(pair_bundle, home / "b"))
    monkeypatch.chdir(b)
    for extra in ([], ["--force"]):
        res = CliRunner().invoke(main, ["compile", "--target", str(llama_target), "-o", "..", *extra])
        one_line_exit_2(res, "home")
    assert sorted(p.name for p in home.iterdir()) == ["b"]


@pytest.mark.parametrize("flag", [["--quant-fast-decode"], ["--quant-block-size", "64"]])
def test_quantization_options_without_quantization_are_refused(tmp_path, llama_target, flag):
    res = CliRunner().invoke(main, ["compile", "--target", str(llama_target), "-o", str(tmp_path / "b"), *flag])
    one_line_exit_2(res, flag[0], "only applies")
    assert not (tmp_path / "b").exists()


def test_empty_calibration_data_is_refused_before_export(tmp_path, llama_target):
    empty = tmp_path / "calib.txt"
    empty.write_text("  \n")
    res = CliRunner().invoke(main, ["compile", "--target", str(llama_target), "-o", str(tmp_path / "b"),
                                    "--quantize", "int4", "--calibration-data", str(empty)])
    one_line_exit_2(res, "is empty")
    assert not (tmp_path / "b").exists()


def test_truncated_resume_file_is_a_clear_error(tmp_path):
    from specrt.recipes.common import load_checkpoint, save_checkpoint

    module = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(module.parameters())
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, module, opt, 3, {"total_steps": 5})
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(path, module, opt)
    torch.save({"model": {}, "step": 1}, path)  # a torch file of another shape
    with pytest.raises(CheckpointError, match="does not fit"):
        load_checkpoint(path, module, opt)


def test_a_failed_replace_leaves_no_trash_directory(tmp_path, monkeypatch):
    # the old bundle is moved aside into .NAME.old-XXXX before the new one takes its place: if that fails, the old
    # one is put back and the aside directory removed (it was left behind, empty, for good)
    from specrt.compiler import output_dir

    out = tmp_path / "b"
    out.mkdir()
    (out / "old.txt").write_text("old")
    tmp = tmp_path / "new"
    tmp.mkdir()
    real = os.rename
    monkeypatch.setattr(output_dir, "check_replaceable", lambda *a, **k: None)

    def rename(src, dst):
        if Path(src) == tmp:
            raise PermissionError(13, "Permission denied")
        return real(src, dst)

    monkeypatch.setattr(output_dir.os, "rename", rename)
    with pytest.raises(PermissionError):
        output_dir.commit(tmp, out, True, output_dir.identity(out))
    assert (out / "old.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "new"]


def test_an_output_force_could_not_replace_does_not_suggest_force(tmp_path, llama_target):
    from helpers import run_cli

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    (tmp_path / "afile").write_text("x")
    for out, says in ((tmp_path / "notes", "is not a specrt bundle"), (tmp_path / "afile", "is not a directory")):
        proc = run_cli("compile", "--target", llama_target, "-o", out, "--max-seq-len", "64")
        assert proc.returncode == 2 and says in proc.stderr and "pass --force" not in proc.stderr, proc.stderr


def test_a_ctrl_c_a_library_swallowed_still_stops_the_commit(tmp_path, monkeypatch):
    # a KeyboardInterrupt raised inside an import can come out as another error that a caller catches; the
    # recorded signal still keeps the bundle from being committed and makes the CLI say "interrupted" (130)
    from specrt.cli.main import handle_errors
    from specrt.compiler import output_dir
    from specrt.core import interrupt

    monkeypatch.setattr(interrupt, "_SEEN", __import__("threading").Event())
    interrupt._SEEN.set()
    tmp = tmp_path / "new"
    tmp.mkdir()
    with pytest.raises(KeyboardInterrupt):
        output_dir.commit(tmp, tmp_path / "b", False, None)
    assert not (tmp_path / "b").exists()

    @handle_errors
    def command():
        raise ImportError("onnxruntime")  # what an interrupted extension import looks like

    with pytest.raises(SystemExit) as exit_:
        command()
    assert exit_.value.code == 130
