"""The temporary sibling `.NAME.tmp-XXXX` a directory is written into (compiler/output_dir.py's rules): its owner
record, the removal of temporaries whose owner died, and SIGTERM handled like Ctrl-C while it exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Iterator

OWNER_FILE = ".specrt-owner.json"
SIGTERM_EXIT = 128 + signal.SIGTERM


def _owner_record() -> dict:
    import psutil

    return {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "host": socket.gethostname()}


def _owner_alive(record: dict) -> bool:
    import psutil

    if record.get("host") != socket.gethostname():
        return True  # another machine's process (shared file system): not ours to judge
    try:
        proc = psutil.Process(int(record["pid"]))
        return abs(proc.create_time() - float(record["create_time"])) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
        return False


def make_temp(out: Path) -> Path:
    """Create the temporary sibling of `out` with its owner record."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    (tmp / OWNER_FILE).write_text(json.dumps(_owner_record()))
    return tmp


def release_temp(tmp: Path) -> None:
    """Remove the owner record just before the manifest is written (it is no part of the bundle)."""
    (tmp / OWNER_FILE).unlink(missing_ok=True)


def remove_stale_temps(out: Path) -> list[Path]:
    """Delete `.NAME.tmp-*` siblings of `out` whose recorded owner process is dead. Returns them."""
    removed = []
    parent = out.parent
    if not parent.is_dir():
        return removed
    for tmp in parent.glob(f".{out.name}.tmp-*"):
        try:
            record = json.loads((tmp / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # no owner record: not provably stale, leave it
        if isinstance(record, dict) and not _owner_alive(record):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


_deferral = {"depth": 0, "pending": False}  # sigterm_deferred blocks in progress, and a signal held back


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """While compiling, SIGTERM raises SystemExit(143) so cleanup runs as it does for Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _deferral["depth"]:
            _deferral["pending"] = True
            return
        raise SystemExit(SIGTERM_EXIT)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Hold a SIGTERM back for a few statements; it is raised (SystemExit 143) right after them.
    (Signal masks do not help: Python runs handlers in the main thread whichever thread got the signal.)"""
    _deferral["depth"] += 1
    try:
        yield
    finally:
        _deferral["depth"] -= 1
    if not _deferral["depth"] and _deferral["pending"]:
        _deferral["pending"] = False
        raise SystemExit(SIGTERM_EXIT)
