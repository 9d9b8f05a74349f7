"""Recipes and helpers that write a directory follow `compile`'s output rule (compiler/output_dir.py):
never into an input, an existing directory only with --force, and --force replaces only what that command
writes; the directory appears whole at the end (a temporary sibling is renamed)."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specrt.cli.main import main
from specrt.compiler.output_dir import HF_CHECKPOINT, OutputError, staged_output

TINY = dict(layers=1, hidden=16, heads=2, steps=1, seq_len=16, batch_size=2, lr=1e-3, max_minutes=None, progress=False,
            eval_prompts=0)


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def ckpt(tmp_path, llama_target):
    return Path(shutil.copytree(llama_target, tmp_path / "ckpt"))


@pytest.fixture
def data(tmp_path):
    import json as json_mod

    d = tmp_path / "data"
    d.mkdir()
    (d / "a.py").write_text(Path(json_mod.__file__).read_text())
    return d


def test_distill_refuses_the_target_as_output(ckpt, data):
    from specrt.recipes.distill import distill_draft

    before = snapshot(ckpt)
    with pytest.raises(OutputError, match="is the input"):
        distill_draft(ckpt, [data], ckpt, **TINY)
    assert snapshot(ckpt) == before


def test_distill_refuses_another_checkpoint_without_force_and_replaces_it_with(tmp_path, ckpt, data, llama_target):
    from specrt.recipes.distill import distill_draft

    other = Path(shutil.copytree(llama_target, tmp_path / "other"))
    before = snapshot(other)
    with pytest.raises(OutputError, match="--force"):
        distill_draft(ckpt, [data], other, **TINY)
    assert snapshot(other) == before
    distill_draft(ckpt, [data], other, force=True, **TINY)
    assert (other / "model.safetensors").read_bytes() != before["model.safetensors"]
    assert not list(tmp_path.glob(".other.tmp-*"))


def test_train_medusa_refuses_the_target_as_output(ckpt, data):
    from specrt.recipes.medusa_train import train_heads_from_paths

    before = snapshot(ckpt)
    with pytest.raises(OutputError, match="is the input"):
        train_heads_from_paths(ckpt, [data], ckpt, num_heads=1, steps=1, max_minutes=None, seq_len=16, batch_size=2,
                               progress=False)
    assert snapshot(ckpt) == before


def test_random_target_refuses_an_existing_checkpoint(ckpt):
    from specrt.bench.random_target import make

    before = snapshot(ckpt)
    with pytest.raises(OutputError, match="--force"):
        make(ckpt, "200k")
    assert snapshot(ckpt) == before


def test_force_never_replaces_a_foreign_directory(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.txt").write_text("years of work")
    with pytest.raises(OutputError, match="not a checkpoint written by specrt"):
        with staged_output(home, True, (), HF_CHECKPOINT):
            pass
    assert (home / "thesis.txt").read_text() == "years of work"


def test_staged_output_leaves_nothing_on_error(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with staged_output(out, False, (), HF_CHECKPOINT) as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("training failed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["distill-draft"], ["train-medusa"]])
def test_cli_refuses_the_target_in_one_line(ckpt, data, command):
    before = snapshot(ckpt)
    res = CliRunner().invoke(main, [*command, "--target", str(ckpt), "--data", str(data), "-o", str(ckpt)])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "is the input" in res.output
    assert snapshot(ckpt) == before


def test_cli_make_random_target_refuses_existing(ckpt):
    before = snapshot(ckpt)
    res = CliRunner().invoke(main, ["bench", "--make-random-target", str(ckpt), "--params", "200k"])
    assert res.exit_code == 2, res.output
    assert "--force" in res.output and snapshot(ckpt) == before


@pytest.mark.parametrize("kind, mine", [("DRAFT_HEAD", "README.md"), ("HF_CHECKPOINT", "tokenizer.json"),
                                        ("HF_CHECKPOINT", "generation_config.json"),
                                        ("MEDUSA_HEADS", "medusa.safetensors")])
def test_force_never_replaces_a_folder_holding_only_a_file_named_like_an_output_file(tmp_path, kind, mine):
    # `train-head -o notes --force` replaced a folder holding only the user's README.md (a name a head also has)
    from specrt.compiler import output_dir
    from specrt.recipes import outputs

    kinds = {"DRAFT_HEAD": outputs.DRAFT_HEAD, "HF_CHECKPOINT": output_dir.HF_CHECKPOINT,
             "MEDUSA_HEADS": output_dir.MEDUSA_HEADS}
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / mine).write_text("years of work")
    with pytest.raises(OutputError, match="exists and is not a"):
        with staged_output(notes, True, (), kinds[kind]):
            pass
    assert [p.name for p in notes.iterdir()] == [mine] and (notes / mine).read_text() == "years of work"
