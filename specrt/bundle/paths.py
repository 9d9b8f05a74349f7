"""Path rules for bundle files: relative, no `..`, and inside the bundle root once symlinks are resolved."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from specrt.core.errors import BundleError


def check_relative(rel: str) -> str:
    """A manifest path must be relative and stay inside the bundle."""
    if "\x00" in rel:
        raise BundleError(f"manifest path {rel!r} contains a NUL character, which no file name holds")
    p = PurePosixPath(rel)
    if p.is_absolute() or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise BundleError(f"manifest path {rel!r} is absolute; bundle paths must be relative")
    if ".." in p.parts:
        raise BundleError(f"manifest path {rel!r} contains '..'; bundle paths must stay inside the bundle")
    return rel


def resolve_inside(root: Path, rel: str) -> Path:
    """root / rel with every symlink resolved; BundleError if that leaves the bundle root."""
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(root / rel))
    if real != real_root and real_root not in real.parents:
        raise BundleError(f"bundle file {rel} resolves to {real}, outside the bundle {real_root} (a symlink?): "
                          "refusing to open it")
    return real
