"""One line for an OS error that ends a compile, naming the side it came from: the output (a full disk, a read-only
or vanished directory) or an input the compile reads (a checkpoint file that is a directory, unreadable, ...).

A compile writes its bundle under the output's parent, into `.NAME.tmp-XXXX` (compiler/output_dir.py), so an error
whose file lies elsewhere is an input's, unless that disk is full (the system's temporary folder: named). Writers that report a short write without an errno (numpy's `tofile`: "8192
requested and 2048 written", what a full disk gives the ONNX writer) are output errors too.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from specrt.core.errors import CheckpointError, InvalidArgument, SpecrtError

# OS errors that mean "the output location is unusable" (exit 2 with one line, not a traceback)
OUTPUT_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR,
                 errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY, errno.ENAMETOOLONG)
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def _is_output_path(name: object, out: Path) -> bool:
    """`name` is `out` or the temporary / trash sibling a compile of `out` writes (`.NAME.tmp-*`, `.NAME.old-*`)."""
    if not isinstance(name, (str, bytes, os.PathLike)):
        return False
    path = Path(os.path.abspath(os.fsdecode(name)))
    try:
        first = path.relative_to(out.parent).parts[0]
    except (ValueError, IndexError):
        return False
    return first == out.name or first.startswith(f".{out.name}.")


def is_short_write(exc: BaseException) -> bool:
    """numpy's `tofile` on a full disk: OSError("8192 requested and 2048 written"), no errno."""
    return isinstance(exc, OSError) and exc.errno is None and bool(SHORT_WRITE.fullmatch(str(exc)))


def is_write_failure(exc: BaseException) -> bool:
    """An OS error a writer raises when the disk is full or the directory unusable (not a library's own error)."""
    return is_short_write(exc) or (isinstance(exc, OSError) and exc.errno in OUTPUT_ERRNOS)


def compile_os_error(exc: OSError, out: Path) -> SpecrtError | None:
    """The error to report for `exc`, raised while compiling into `out`; None: not one we can explain (re-raise)."""
    names = [n for n in (exc.filename, getattr(exc, "filename2", None)) if n is not None]
    reason = exc.strerror or str(exc)
    if names and not any(_is_output_path(n, out) for n in names):
        if exc.errno in FULL_DISK:  # another disk filled up (the system's temporary folder): name it
            return InvalidArgument(f"cannot write {os.fsdecode(names[0])} while compiling {out}: {reason}")
        return CheckpointError(f"cannot read {os.fsdecode(names[0])}: {reason}")
    if is_short_write(exc):  # a short write: the disk filled up under a writer that keeps no errno
        return InvalidArgument(f"cannot write output {out}: a write was cut short ({exc}): is the disk full?")
    if exc.errno in OUTPUT_ERRNOS:
        return InvalidArgument(f"cannot write output {out}: {reason}")
    return None
