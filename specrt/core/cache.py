"""specrt's cache directory (downloaded demo wheels, the benchmark peers' builds)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SPECRT_CACHE, else $XDG_CACHE_HOME/specrt, else ~/.cache/specrt."""
    if os.environ.get("SPECRT_CACHE"):
        return Path(os.environ["SPECRT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specrt"
