"""Nothing lost: every `-o` / `--force` combination through the CLI, end to end.

A directory holding a user's file must survive each of them; refused outputs exit 2 with one line naming
the path, before anything is exported. Refusals run the CLI in-process (tests/helpers.py run_cli); what
depends on the process itself (signals, two processes racing) runs `python -m specrt` for real; a dead
owner's temporary is a record naming an exited process, removed by an in-process compile.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_cli

from specrt.bundle.manifest import read_manifest

FAST = ("--max-seq-len", "64", "--max-draft-tokens", "4")


def specrt(*args, cwd=None):
    return run_cli(*args, cwd=cwd)


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def user_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "thesis.txt").write_text("years of work")
    return path


def assert_refused(proc, *words):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    assert "export" not in proc.stderr  # refused before anything was exported


@pytest.fixture
def ckpt(tmp_path, llama_target):
    return Path(shutil.copytree(llama_target, tmp_path / "ckpt"))


def test_force_refuses_current_directory_with_user_files(tmp_path, ckpt):
    home = user_dir(tmp_path / "home")
    before = snapshot(home)
    proc = specrt("compile", "--target", ckpt, "-o", ".", "--force", *FAST, cwd=home)
    assert_refused(proc, "not a specrt bundle")
    assert snapshot(home) == before


@pytest.mark.parametrize("where", ["same", "parent", "inside"])
def test_output_may_not_overlap_the_checkpoint(tmp_path, ckpt, where):
    out = {"same": ckpt, "parent": tmp_path, "inside": ckpt / "bundle"}[where]
    (tmp_path / "notes.txt").write_text("keep me")
    before = snapshot(tmp_path)
    proc = specrt("compile", "--target", ckpt, "-o", out, "--force", *FAST)
    assert_refused(proc, "input")
    assert snapshot(tmp_path) == before


def test_output_may_not_overlap_the_draft(tmp_path, ckpt, llama_draft):
    draft = Path(shutil.copytree(llama_draft, tmp_path / "draft"))
    before = snapshot(draft)
    assert_refused(specrt("compile", "--target", ckpt, "--draft", draft, "-o", draft, "--force", *FAST), "input")
    assert snapshot(draft) == before


def test_force_refuses_a_directory_that_is_not_a_bundle(tmp_path, ckpt):
    out = user_dir(tmp_path / "out")
    proc = specrt("compile", "--target", ckpt, "-o", out, "--force", *FAST)
    assert_refused(proc, str(out), "not a specrt bundle")
    assert (out / "thesis.txt").read_text() == "years of work"


def test_force_refuses_a_bundle_holding_user_files(tmp_path, ckpt, pair_bundle):
    out = Path(shutil.copytree(pair_bundle, tmp_path / "b"))
    (out / "notes.txt").write_text("mine")
    assert_refused(specrt("compile", "--target", ckpt, "-o", out, "--force", *FAST), "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("force", [True, False])
def test_output_that_is_a_file_is_refused_up_front(tmp_path, ckpt, force):
    afile = tmp_path / "afile"
    afile.write_text("data")
    proc = specrt("compile", "--target", ckpt, "-o", afile, *(["--force"] if force else []), *FAST)
    assert_refused(proc, str(afile))
    assert afile.read_text() == "data"
    proc = specrt("compile", "--target", ckpt, "-o", afile / "sub", *FAST)
    assert_refused(proc, "not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "ckpt"]


@pytest.mark.slow
def test_force_replaces_a_bundle_and_an_empty_directory(tmp_path, ckpt):
    out = tmp_path / "b"
    out.mkdir()
    assert specrt("compile", "--target", ckpt, "-o", out, "--force", *FAST).returncode == 0
    first = read_manifest(out).created
    proc = specrt("compile", "--target", ckpt, "-o", out, "--force", *FAST)
    assert proc.returncode == 0, proc.stderr
    read_manifest(out)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [] and first


def test_demo_rebuilds_only_its_own_bundle(tmp_path, llama_target, llama_draft, pair_bundle):
    models = tmp_path / "models"
    shutil.copytree(llama_target, models / "target")
    shutil.copytree(llama_draft, models / "draft")
    out = user_dir(tmp_path / "demo")
    proc = specrt("demo", "--models", models, "--output", out, "--repeats", 1, "--max-new-tokens", 2)
    assert_refused(proc, "not a demo bundle")
    assert (out / "thesis.txt").exists()
    stale = Path(shutil.copytree(pair_bundle, tmp_path / "stale"))  # a stale demo bundle + a user's notes
    m = json.loads((stale / "manifest.json").read_text())
    (stale / "manifest.json").write_text(json.dumps(m | {"demo": {"fingerprint": "old"}}))
    (stale / "notes.txt").write_text("mine")
    proc = specrt("demo", "--models", models, "--output", stale, "--repeats", 1, "--max-new-tokens", 2)
    assert_refused(proc, "notes.txt")
    assert (stale / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_two_compiles_racing_for_one_output(tmp_path, ckpt):
    out = tmp_path / "b"
    cmd = [sys.executable, "-m", "specrt", "compile", "--target", str(ckpt), "-o", str(out), *FAST]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in (first, second)]
    assert sorted(code for code, _ in results) == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "another process" in loser or "already exists" in loser
    read_manifest(out)  # the winner's bundle is intact and verifies
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow
def test_sigterm_during_compile_leaves_no_temporary(tmp_path, ckpt, llama_draft):
    # target + draft: two exports, so the signal lands well inside the compile
    proc = subprocess.Popen([sys.executable, "-m", "specrt", "compile", "--target", str(ckpt), "--draft",
                             str(llama_draft), "-o", str(tmp_path / "b"), *FAST],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".b.tmp-*")):
        assert time.monotonic() < deadline and proc.poll() is None, "compile never created its temporary"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    if (tmp_path / "b").exists():  # a heavily loaded machine: the compile finished before the signal
        read_manifest(tmp_path / "b")
    else:
        assert code == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "b") == ["ckpt"]


@pytest.mark.slow
def test_next_compile_removes_temporaries_of_dead_processes(tmp_path, ckpt):
    import psutil

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_record = {"pid": dead.pid, "create_time": psutil.Process(dead.pid).create_time(), "host": os.uname().nodename}
    dead.wait()
    stale, alive = tmp_path / ".b.tmp-stale", tmp_path / ".b.tmp-alive"
    for d, record in ((stale, dead_record), (alive, {"pid": os.getpid(), "host": os.uname().nodename,
                                                     "create_time": psutil.Process().create_time()})):
        d.mkdir()
        (d / ".specrt-owner.json").write_text(json.dumps(record))
        (d / "model.onnx.data").write_bytes(b"x" * 1000)
    proc = specrt("compile", "--target", ckpt, "-o", tmp_path / "b", *FAST)  # in-process: "alive" is this process
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and alive.exists()  # a live owner's temporary is left alone
