"""Corpus helpers.

The demo corpus is the source code of the Python standard library of the running
interpreter (``sysconfig.get_paths()["stdlib"]``): ``.py`` files only, excluding
``site-packages`` and the ``test``/``tests``/``idlelib``/``lib2to3`` directories, and
files larger than 200 kB.  Files are sorted by their path relative to the stdlib
root; every 20th file (sorted index 0, 20, 40, ...) is held out for evaluation.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Iterable, Sequence

from specrt.core.errors import InvalidArgument

EOS_TOKEN = "<|endoftext|>"
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3"})
MAX_FILE_BYTES = 200_000
HELDOUT_EVERY = 20


def stdlib_root() -> Path:
    """Return the standard library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: str | os.PathLike | None = None) -> list[Path]:
    """List the corpus files (sorted, deterministic) under ``root`` (default: stdlib)."""
    root = Path(root) if root is not None else stdlib_root()
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        for name in filenames:
            path = Path(dirpath) / name
            if name.endswith(".py") and path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def split_files(files: Sequence[Path], every: int = HELDOUT_EVERY) -> tuple[list[Path], list[Path]]:
    """Split a sorted file list into (train, heldout): every ``every``-th file is held out."""
    train = [f for i, f in enumerate(files) if i % every != 0]
    heldout = [f for i, f in enumerate(files) if i % every == 0]
    return train, heldout


def _expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The files named, and the regular files under the directories named (a FIFO or a device inside a
    directory is skipped; one named is refused when read)."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise InvalidArgument(f"--data {p}: no such file or directory")
    return out


def read_text_files(paths: Iterable[str | os.PathLike] | str | os.PathLike) -> list[str]:
    """Read text documents from files and/or directories (recursively, sorted).

    Only regular files are read, each up to CORPUS_MAX_BYTES (specrt/core/textfile.py: a FIFO, /dev/zero or
    a file past the cap is one InvalidArgument, nothing read). Files that are not valid UTF-8 are decoded with
    replacement characters; empty files are skipped.  Returns one string per file.
    """
    from specrt.core.textfile import CORPUS_MAX_BYTES, read_user_bytes

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    docs = []
    for f in _expand(paths):
        text = read_user_bytes(f, "--data", CORPUS_MAX_BYTES).decode("utf-8", errors="replace")
        if text.strip():
            docs.append(text)
    return docs


def stdlib_corpus(root: str | os.PathLike | None = None) -> dict:
    """Return the demo corpus: file lists and texts for the train and held-out splits."""
    root_path = Path(root) if root is not None else stdlib_root()
    train, heldout = split_files(stdlib_files(root_path))
    rel = lambda fs: [f.relative_to(root_path).as_posix() for f in fs]  # noqa: E731
    return {
        "root": str(root_path),
        "train_files": train,
        "heldout_files": heldout,
        "train_names": rel(train),
        "heldout_names": rel(heldout),
        "train_bytes": sum(f.stat().st_size for f in train),
        "heldout_bytes": sum(f.stat().st_size for f in heldout),
    }
