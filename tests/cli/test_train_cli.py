"""`specrt distill-draft` and `specrt train-medusa` on a tiny target: the outputs compile and run."""

import json

import pytest
from helpers import run_cli


def specrt(*args, cwd=None):
    """In-process (tests/helpers.py run_cli): what a `python -m specrt` process would print and exit with."""
    return run_cli(*args, cwd=cwd)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    import json as json_mod
    import textwrap
    from pathlib import Path

    d = tmp_path_factory.mktemp("text")
    for mod in (json_mod, textwrap):
        (d / Path(mod.__file__).name).write_text(Path(mod.__file__).read_text())
    return d


@pytest.mark.slow
def test_distill_draft_then_compile_and_generate(tmp_path, llama_target, text_dir):
    out = tmp_path / "draft"
    proc = specrt("distill-draft", "--target", llama_target, "--data", text_dir, "-o", out, "--layers", 1,
                  "--hidden", 32, "--steps", 3, "--seq-len", 32, "--batch-size", 2, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["acceptance"] is not None and (out / "config.json").exists()
    bundle = tmp_path / "bundle"
    assert specrt("compile", "--target", llama_target, "--draft", out, "-o", bundle, "--max-seq-len", 64,
                  "--max-draft-tokens", 4).returncode == 0
    proc = specrt("generate", bundle, "--prompt", "import os", "--max-new-tokens", 8, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stats"]["method"] == "auto"  # the default (#51)


@pytest.mark.slow
def test_train_medusa_then_compile(tmp_path, llama_target, text_dir):
    out = tmp_path / "heads"
    proc = specrt("train-medusa", "--target", llama_target, "--data", text_dir, "-o", out, "--num-heads", 2,
                  "--steps", 3, "--seq-len", 32, "--batch-size", 2)
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads((out / "medusa_config.json").read_text())
    assert cfg["medusa_num_heads"] == 2
    bundle = tmp_path / "bundle"
    proc = specrt("compile", "--target", llama_target, "--medusa", out, "-o", bundle, "--max-seq-len", 64,
                  "--max-draft-tokens", 4)
    assert proc.returncode == 0, proc.stderr
    assert "(target, 2 Medusa heads;" in proc.stdout  # the closing line names what the bundle holds
    proc = specrt("generate", bundle, "--prompt", "import os", "--max-new-tokens", 8, "--method", "medusa",
                  "--num-speculative-tokens", 2, "--json")
    assert proc.returncode == 0, proc.stderr


def test_bad_training_input(tmp_path, llama_target):
    proc = run_cli("distill-draft", "--target", tmp_path / "nope", "--data", tmp_path, "-o", tmp_path / "o")
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("train-medusa", "--target", llama_target, "--data", tmp_path / "missing", "-o", tmp_path / "o")
    assert proc.returncode == 2 and "--data" in proc.stderr
