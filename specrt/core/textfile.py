"""Reading a text file a user names on the command line (a schema, a grammar, prompts, calibration text): one
rule, one clear error.

    text = read_user_text(path, "--prompts-file", max_bytes=PROMPTS_MAX_BYTES)

Only a regular file is read (a FIFO would block forever, `/dev/zero` never ends), and only up to `max_bytes`: the
file is opened without blocking, checked with fstat, and read to at most one byte past the cap, so neither a
device nor a file that grows while read can fill memory. Everything else is `InvalidArgument` naming the option
and the path (docs/safety.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from specrt.core.errors import InvalidArgument

MIB = 1 << 20
PROMPTS_MAX_BYTES = 64 * MIB  # --prompts-file, bench --prompts
CALIBRATION_MAX_BYTES = 64 * MIB  # --calibration-data
CORPUS_MAX_BYTES = 64 * MIB  # --data (distill-draft, train-medusa): each file


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n:,} bytes"


def read_user_text(path: str | Path, option: str, max_bytes: int) -> str:
    """The UTF-8 text of the regular file `path`, at most `max_bytes` long."""
    data = read_user_bytes(path, option, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{option} {path} is not UTF-8 text") from None


def read_user_bytes(path: str | Path, option: str, max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` of them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting for a writer
    except FileNotFoundError:
        raise InvalidArgument(f"cannot read {option} {path}: no such file") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read {option} {path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd)
    if not stat.S_ISREG(mode.st_mode) or mode.st_size > max_bytes:
        os.close(fd)
        if not stat.S_ISREG(mode.st_mode):
            raise InvalidArgument(f"{option} {path} is {_kind(mode.st_mode)}; give a regular text file")
        raise InvalidArgument(f"{option} {path} is {_size(mode.st_size)}; the limit is {_size(max_bytes)}")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise InvalidArgument(f"cannot read {option} {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew while read
        raise InvalidArgument(f"{option} {path} is larger than the limit of {_size(max_bytes)}")
    return data
