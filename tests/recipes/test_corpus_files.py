"""--data (distill-draft, train-medusa) read through the one reader of files named on the command line
(specrt/core/textfile.py): a FIFO, a device or a file past the cap is one InvalidArgument, nothing read (issue 49:
a FIFO was "no such file" with exit 1, a 3 GB file was read whole until the process was killed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specrt.core.errors import InvalidArgument
from specrt.core.textfile import CORPUS_MAX_BYTES
from specrt.recipes.corpus import read_text_files


def test_a_fifo_a_device_and_a_link_to_one_are_refused_naming_what_they_are(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "zero").symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), ("/dev/zero", "a character device"), (tmp_path / "zero", "a character device")):
        with pytest.raises(InvalidArgument, match=f"--data {path} is {kind}"):
            read_text_files([path])
    with pytest.raises(InvalidArgument, match="no such file or directory"):
        read_text_files([tmp_path / "missing.txt"])


def test_a_file_past_the_cap_is_refused_before_it_is_read(tmp_path):
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(CORPUS_MAX_BYTES + 1)  # sparse: no disk used
    with pytest.raises(InvalidArgument, match="the limit is 64.0 MiB"):
        read_text_files([huge])


def test_a_directory_reads_its_regular_files_and_skips_fifos(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "b.txt").write_bytes(b"beta \xff")  # not UTF-8: replacement characters, as before
    os.mkfifo(tmp_path / "c.fifo")
    assert read_text_files(tmp_path) == ["alpha", "beta \ufffd"]


def test_distill_refuses_too_little_held_out_text_before_training(tmp_path, llama_target):
    # 2 held-out tokens: the draft trained, then its evaluation crashed in a reshape (exit 1, no draft)
    from specrt.recipes.distill import distill_draft

    (tmp_path / "d.txt").write_text("hello world\nfoo bar\nimport os\nthe cat\n")  # 2 held-out tokens
    with pytest.raises(InvalidArgument, match="held-out tokens .* needs 3"):
        distill_draft(llama_target, [tmp_path / "d.txt"], tmp_path / "out", layers=1, hidden=64, steps=1, seq_len=16,
                      batch_size=2, lr=1e-3, progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out_run" / "ckpt.pt").exists()


def test_train_head_prompts_past_the_cap_are_refused_before_they_are_read(tmp_path):
    # a 3 GB --prompts file was read whole (6.5 GB of memory) before "needs at least 2 prompts"
    from specrt.core.textfile import PROMPTS_MAX_BYTES
    from specrt.recipes.head_data import read_prompts

    huge = tmp_path / "prompts.txt"
    with open(huge, "wb") as f:
        f.truncate(PROMPTS_MAX_BYTES + 1)
    with pytest.raises(InvalidArgument, match="--prompts .* the limit is 64.0 MiB"):
        read_prompts(huge)
    with pytest.raises(InvalidArgument, match="is a character device"):
        read_prompts(Path("/dev/zero"))
    assert len(read_prompts(None)) > 2  # the shipped set is read as before
