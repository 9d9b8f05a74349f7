"""Where `compile` writes: rules that keep a user's files safe (README "Safety").

* `-o` may not be, contain or sit inside an input checkpoint (`--target`, `--draft`, `--medusa`).
* An existing `-o` needs `--force`, and `--force` replaces only an empty directory or a specrt bundle
  (a readable manifest whose file list covers everything in the directory); anything else is refused
  up front, naming the path.
* The output path is checked (a directory, in a writable parent) before anything is exported.
* The bundle is written into a temporary sibling `.NAME.tmp-XXXX` that records its owner process (output_temp.py);
  SIGTERM cleans it up like SIGINT, and the next compile of the same output removes temporaries whose
  owner is dead.
* The final rename happens under a lock on the parent directory and only if `-o` is still what it was
  when the compile started: of two compiles racing for one output, the loser fails and the winner's
  bundle stays.

The same rules hold for every command and library function that writes a directory (`distill-draft`,
`train-medusa`, `bench --make-random-target`): they write through `staged_output(out, force, inputs, kind)`,
where `kind` says what `--force` may replace (`BUNDLE`, or an `OutputKind` listing the files that command
writes: a directory holding anything else is someone else's).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Iterable, Iterator

from specrt.bundle.manifest import MANIFEST, listed_files
from specrt.core.errors import InvalidArgument
from specrt.compiler.output_temp import make_temp, release_temp, remove_stale_temps, sigterm_as_exit, sigterm_deferred


class OutputError(InvalidArgument):
    """The output path of `compile` cannot be used safely (exit 2; nothing was written or deleted)."""


def _resolve(p: Path) -> Path:
    return Path(os.path.realpath(p))


def check_not_overlapping(out: Path, inputs: Iterable[Path | None]) -> None:
    """`out` must not be an input, contain one, or sit inside one."""
    o = _resolve(out)
    for given in inputs:
        if given is None:
            continue
        i = _resolve(Path(given))
        if o == i or i in o.parents or o in i.parents:
            relation = "is" if o == i else ("is inside" if i in o.parents else "contains")
            raise OutputError(f"output {out} {relation} the input {given}: choose an output directory outside "
                              "every checkpoint")


def bundle_extra_files(path: Path) -> list[str] | None:
    """None if `path` is not a readable specrt bundle, else the files in it its manifest does not list."""
    listed = listed_files(path)
    if listed is None:
        return None
    listed |= {MANIFEST}
    extra = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_symlink() or (not p.is_dir() and rel not in listed):
            extra.append(rel)
    return extra


@dataclass(frozen=True)
class OutputKind:
    """What a command writes into its output directory: `--force` replaces a directory of that kind only.
    `files`: glob patterns of the top-level files it writes (None: a bundle, by manifest); `marker`: the file each
    output of the kind holds (without it, a folder of only a README.md of yours is not a draft head)."""

    name: str
    files: tuple[str, ...] | None = None
    marker: str | None = None

    def extra_files(self, path: Path) -> list[str] | None:
        """None if `path` is not of this kind, else the files in it that this kind does not write."""
        if self.files is None:
            return bundle_extra_files(path)
        if self.marker is not None and (not (path / self.marker).is_file() or (path / self.marker).is_symlink()):
            return None
        entries = sorted(path.iterdir())
        extra = [p.name for p in entries
                 if p.is_symlink() or p.is_dir() or not any(fnmatch(p.name, pat) for pat in self.files)]
        return None if len(extra) == len(entries) else extra


BUNDLE = OutputKind("specrt bundle")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "chat_template.jinja")
HF_CHECKPOINT = OutputKind("checkpoint written by specrt",
                           ("config.json", "generation_config.json", "model.safetensors", "model-*.safetensors",
                            "model.safetensors.index.json", *TOKENIZER_FILES), "config.json")
MEDUSA_HEADS = OutputKind("Medusa heads directory", ("medusa_config.json", "medusa.safetensors"), "medusa_config.json")


def check_replaceable(out: Path, kind: OutputKind = BUNDLE) -> None:
    """With --force: `out` may be replaced only if it is an empty directory or a directory of `kind` with no
    files of its own."""
    if not out.is_dir() or out.is_symlink():
        raise OutputError(f"output {out} exists and is not a directory: refusing to replace it (choose another -o)")
    if not any(out.iterdir()):
        return
    extra = kind.extra_files(out)
    if extra is None:
        raise OutputError(f"output {out} exists and is not a {kind.name}: --force replaces only a {kind.name} or "
                          "an empty directory (choose another -o)")
    if extra:
        shown = ", ".join(extra[:3]) + (" ..." if len(extra) > 3 else "")
        raise OutputError(f"output {out} is a {kind.name} but also holds files that are not part of it ({shown}): "
                          "move them away or choose another -o")


def check_parent_writable(out: Path) -> None:
    """The nearest existing ancestor of `out` must be a directory we can create entries in."""
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write output {out}: {parent} is not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=".specrt-probe-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise OutputError(f"cannot write output {out}: {parent} is not writable ({exc.strerror})") from None


def check_output(out: Path, force: bool, inputs: Iterable[Path | None] = (), kind: OutputKind = BUNDLE) -> None:
    """Every output rule that can be checked before compiling (see the module docstring)."""
    out = Path(os.path.abspath(out))
    try:
        os.lstat(out)
    except FileNotFoundError:
        pass
    except OSError as exc:  # a name too long for the file system, a file where a parent folder belongs, ...
        if exc.errno != errno.ENOTDIR:
            raise OutputError(f"cannot write output {out}: {exc.strerror or exc}") from None
    check_not_overlapping(out, inputs)
    if out.exists() or out.is_symlink():
        check_replaceable(out, kind)  # what --force could not replace is said first, not "pass --force"
        if not force:
            raise OutputError(f"output directory {out} already exists: pass --force to replace it")
    check_parent_writable(out)


def identity(out: Path) -> tuple[int, int] | None:
    """What `out` is now (device, inode), or None if absent: a change means another process wrote it."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


# ------------------------------------------------------------------------------------ the final step
@contextlib.contextmanager
def parent_lock(out: Path) -> Iterator[None]:
    """An exclusive flock on the parent directory of `out` (no lock file is left behind)."""
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def apply_umask(root: Path) -> None:
    """Give `root` and everything in it the permissions a plain mkdir / open would (0777 / 0666 less the
    umask): temporary directories and files are created 0700 / 0600, which would keep a bundle from other
    users and Ray nodes whatever the umask says."""
    mask = current_umask()
    os.chmod(root, 0o777 & ~mask)
    for path in root.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def commit(tmp: Path, out: Path, force: bool, started_as: tuple[int, int] | None,
           kind: OutputKind = BUNDLE) -> None:
    """Move the finished bundle `tmp` to `out`, atomically with respect to other compiles. Not after a Ctrl-C,
    even one a library swallowed (specrt/core/interrupt.py): the caller removes `tmp`."""
    from specrt.core.interrupt import interrupted

    if interrupted():
        raise KeyboardInterrupt
    apply_umask(tmp)
    with parent_lock(out):
        now = identity(out)
        if now != started_as:
            raise OutputError(f"output {out} was {'created' if started_as is None else 'changed'} by another "
                              "process while compiling: nothing replaced (rerun to overwrite it with --force)")
        if now is not None:
            if not force:
                raise OutputError(f"output directory {out} already exists: pass --force to replace it")
            check_replaceable(out, kind)
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            replaced = False
            try:
                os.rename(out, trash / "bundle")
                try:
                    os.rename(tmp, out)
                    replaced = True
                except OSError:
                    os.rename(trash / "bundle", out)  # put the old bundle back
                    raise
            finally:  # the old bundle, or nothing; kept only if the old bundle could not be put back
                if replaced or not (trash / "bundle").exists():
                    shutil.rmtree(trash, ignore_errors=True)
        else:
            try:
                os.rename(tmp, out)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise OutputError(f"output directory {out} appeared while compiling: nothing replaced") from None
                raise


@contextlib.contextmanager
def staged_output(out: Path, force: bool, inputs: Iterable[Path | None] = (),
                  kind: OutputKind = BUNDLE) -> Iterator[Path]:
    """Write a directory the safe way: check `out` now (module rules), yield a temporary sibling to write
    into, and on success move it to `out` (replacing an old one of `kind` only with `force`). On any error
    or signal the temporary is removed and `out` is untouched."""
    out = Path(os.path.abspath(out))  # `-o ..` or `-o .` name a real parent and a real name
    check_output(out, force, tuple(inputs), kind)
    started_as = identity(out)
    tmp = None
    with sigterm_as_exit():
        try:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                remove_stale_temps(out)
                with sigterm_deferred():
                    tmp = make_temp(out)
            except OSError as exc:
                raise OutputError(f"cannot write output {out}: {exc.strerror or exc}") from None
            yield tmp
            release_temp(tmp)
            with sigterm_deferred():
                commit(tmp, out, force, started_as, kind)
        finally:
            if tmp is not None and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
