"""Where the training recipes write (docs/safety.md §1): one rule for every recipe's output and run directory.

`recipe_output(out, force, inputs, kind, run_dir)` is the one way a recipe (`train-head`, `distill-draft`,
`train-medusa`) writes: `check_recipe_output` first (the CLI calls it too, before anything is loaded), then
compile's `staged_output` (compiler/output_dir.py): `-o` is never an input, contains none and sits inside none
(the target, `--data`, `--prompts`, ...); an existing `-o` needs `--force`, and `--force` replaces only what that
recipe writes (`kind`) or an empty directory; the output appears whole at the end, with the permissions the
umask gives.

The run directory (caches, resume checkpoints; default `<out>_run`) follows the same spirit: it may not be, contain
or sit inside an input, may not be or sit inside the output (the output is replaced as a whole), and an existing
non-empty one must carry the mark a recipe leaves (`RUN_MARK`): a directory of someone else's is never written
into (recipes delete their own stale caches there). The mark also records what the caches were made from
(`made_for`: the target's file hashes, the data's, the options that shape the caches): a run directory whose caches
were made for another target or other options is refused, naming what differs, rather than trained on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from specrt.compiler.output_dir import OutputError, OutputKind, check_output, staged_output

RUN_MARK = "specrt-run.json"

# what `train-head` writes into its output directory (its --force replaces only this)
DRAFT_HEAD = OutputKind("draft-head directory written by specrt",
                        ("head_config.json", "head.safetensors", "metrics.json", "README.md"), "head_config.json")


def default_run_dir(out: Path, run_dir: str | os.PathLike | None) -> Path:
    return Path(run_dir) if run_dir is not None else Path(out).with_name(Path(out).name + "_run")


def check_run_dir(run: Path, inputs: Iterable[Path | None], out: Path) -> None:
    """The run directory's rules (module docstring), before anything is written."""
    o, r = Path(os.path.realpath(out)), Path(os.path.realpath(run))
    for given in inputs:
        i = Path(os.path.realpath(given))
        if r == i or i in r.parents or r in i.parents:
            relation = "is" if r == i else ("is inside" if i in r.parents else "contains")
            raise OutputError(f"run directory {run} {relation} the input {given}: choose a --run-dir outside every "
                              "input")
    if r == o or o in r.parents:
        raise OutputError(f"run directory {run} {'is' if r == o else 'is inside'} the output {out}, which is replaced "
                          "as a whole: choose a --run-dir outside it")
    if r.exists() and not r.is_dir():
        raise OutputError(f"run directory {run} exists and is not a directory: choose another --run-dir")
    if r.is_dir() and any(r.iterdir()) and not (r / RUN_MARK).is_file():
        raise OutputError(f"run directory {run} exists and was not made by a specrt recipe (no {RUN_MARK}: a folder "
                          "of yours, or the run directory of an older specrt whose caches cannot be checked): choose "
                          "another --run-dir (or an empty one)")


def check_recipe_output(out: Path, force: bool, inputs: Iterable[Path | None], kind: OutputKind,
                        run_dir: str | os.PathLike | None = None) -> Path:
    """Every output rule a recipe can check before it loads anything; returns the run directory."""
    inputs = tuple(Path(i) for i in inputs if i is not None)
    out = Path(os.path.abspath(out))
    check_output(out, force, inputs, kind)
    run = default_run_dir(out, run_dir)
    check_run_dir(run, inputs, out)
    return run


def path_digest(path: str | os.PathLike | None) -> str | None:
    """sha256 of a file, or of a directory's files (relative path and content of each, in order); None: no path."""
    if path is None:
        return None
    path = Path(path)
    if path.is_file():
        return _file_digest(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(p.relative_to(path).as_posix().encode() + b"\0" + _file_digest(p).encode() + b"\n")
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def claim_run_dir(run: Path, made_for: dict) -> None:
    """Create the run directory (or reuse one made for the same `made_for`) and record `made_for` in its mark.
    Caches made for anything else are refused, naming the first field that differs."""
    run.mkdir(parents=True, exist_ok=True)
    mark = run / RUN_MARK
    made_for = json.loads(json.dumps(made_for))  # as it reads back (tuples -> lists)
    try:
        recorded = json.loads(mark.read_text()) if mark.is_file() else {}
    except (OSError, ValueError):
        recorded = {}
    before = recorded.get("made_for") if isinstance(recorded, dict) else None
    caches = [p.name for p in run.iterdir() if p.name not in (RUN_MARK, "metrics.json") and not p.name.startswith(".")]
    if caches and before != made_for:
        if not isinstance(before, dict):
            why = "records nothing about what they were made from"
        else:
            key = next(k for k in sorted(set(before) | set(made_for)) if before.get(k) != made_for.get(k))
            why = f"were made for {key} {_short(before.get(key))}, this run's is {_short(made_for.get(key))}"
        raise OutputError(f"run directory {run} holds caches ({', '.join(sorted(caches)[:3])}) that {why}: delete "
                          "it or choose another --run-dir")
    mark.write_text(json.dumps({"made_for": made_for}, indent=1) + "\n")


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


@contextlib.contextmanager
def recipe_output(out: str | os.PathLike, force: bool, inputs: Iterable[Path | None], kind: OutputKind,
                  run_dir: str | os.PathLike | None = None, made_for: dict | None = None
                  ) -> Iterator[tuple[Path, Path]]:
    """Yield (staging directory, run directory): write the output into the staging directory; it becomes `out`
    when the block ends without an error (module docstring). `made_for`: what the run directory's caches depend
    on (`path_digest` of the target and the data, the options that shape the caches)."""
    inputs = tuple(Path(i) for i in inputs if i is not None)
    run = check_recipe_output(Path(out), force, inputs, kind, run_dir)
    with staged_output(Path(out), force, inputs, kind) as staging:
        claim_run_dir(run, made_for or {})
        yield staging, run
