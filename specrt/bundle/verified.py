"""Checksums verified once per file version: `VerifiedCache`, used by `verify_files` (the load path).

Hashing a SmolLM2 int4 bundle's files costs ~0.3 s of every cold start on 2 cores. A file whose sha256 matched the
manifest is recorded with its identity as the operating system reports it: device, inode, size, mtime_ns and
**ctime_ns**. The next load skips hashing that file only when all five are unchanged and the manifest still expects
the recorded digest. Any write to the file changes its mtime and ctime; resetting the mtime (`touch -d`, `os.utime`)
changes the ctime, which user programs cannot set back; replacing the file (rename, copy) changes its inode. So a
modified file is hashed again and refused, as before (docs/safety.md). `specrt inspect` and
`read_manifest(verify_checksums=True)` always hash everything.

The cache lives in the user's cache directory (`$SPECRT_CACHE`, else `$XDG_CACHE_HOME/specrt`, else
~/.cache/specrt), `verified/<sha256 of the bundle's real path, 16 hex>.json`, mode 0600: read-only bundles
benefit too, and another user cannot make a process skip a check. A missing, unreadable or malformed cache is
treated as empty; failing to write it only costs the next load its hashing. `SPECRT_NO_VERIFY_CACHE=1` turns it
off.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from specrt.core.cache import cache_dir

ENV_OFF = "SPECRT_NO_VERIFY_CACHE"
SETTLE_NS = 2_000_000_000  # a file changed less than 2 s ago is hashed every time (see `record`)


def file_identity(path: Path) -> list[int]:
    """[device, inode, size, mtime_ns, ctime_ns] of `path` (symlinks followed)."""
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class VerifiedCache:
    """Digests that matched a manifest, keyed by each file's real path, with the identity it had then."""

    def __init__(self, root: Path) -> None:
        self.enabled = not os.environ.get(ENV_OFF)
        real = os.path.realpath(root)
        self.path = cache_dir() / "verified" / (hashlib.sha256(real.encode()).hexdigest()[:16] + ".json")
        self.entries: dict[str, list] = self._read() if self.enabled else {}
        self.changed = False

    def _read(self) -> dict[str, list]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return {}
        return data if isinstance(data, dict) else {}

    def known(self, path: Path, sha256: str) -> bool:
        """True when `path` was verified against `sha256` and has not changed since."""
        if not self.enabled:
            return False
        entry = self.entries.get(os.path.realpath(path))
        try:
            return entry == [*file_identity(path), sha256]
        except OSError:
            return False

    def record(self, path: Path, sha256: str, identity: list[int]) -> None:
        """`path` (whose identity was `identity` before it was hashed) matched `sha256`. Not recorded when its
        ctime is under SETTLE_NS old: file timestamps advance in clock ticks (milliseconds), so a change in the
        same tick as the last one could keep the ctime; a change a second later cannot."""
        settled = time.time_ns() - identity[4] > SETTLE_NS
        if self.enabled and settled and identity == file_identity(path):  # unchanged while it was hashed
            self.entries[os.path.realpath(path)] = [*identity, sha256]
            self.changed = True

    def save(self) -> None:
        """Write the cache atomically (best effort)."""
        if not (self.enabled and self.changed):
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".verified-", dir=self.path.parent)  # mode 0600
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.entries, f)
            os.replace(tmp, self.path)
        except OSError:
            pass
