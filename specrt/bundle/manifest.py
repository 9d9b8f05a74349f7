"""The bundle: a directory with `manifest.json`, ONNX graphs, configs, tokenizer and (optionally) engines.

`compile` writes it (specrt.compiler.bundle_writer); `load` trusts it only after `read_manifest` has
validated the format version, every path (relative, no `..`) and every file's sha256.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

from .. import BUNDLE_FORMAT_VERSION, __version__
from ..core.errors import BundleError, ChecksumMismatch, VersionMismatch

MANIFEST = "manifest.json"
FORMAT_NAME = "specrt-bundle"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_relative(rel: str) -> str:
    """A manifest path must be relative and stay inside the bundle."""
    p = PurePosixPath(rel)
    if p.is_absolute() or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise BundleError(f"manifest path {rel!r} is absolute; bundle paths must be relative")
    if ".." in p.parts:
        raise BundleError(f"manifest path {rel!r} contains '..'; bundle paths must stay inside the bundle")
    return rel


class Manifest:
    """A validated manifest.json, with paths resolved against the bundle directory."""

    def __init__(self, root: Path, data: dict[str, Any]) -> None:
        self.root = root
        self.data = data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def path(self, rel: str) -> Path:
        return self.root / check_relative(rel)

    @property
    def models(self) -> dict[str, Any]:
        return self.data["models"]

    @property
    def max_seq_len(self) -> int:
        return int(self.data["max_seq_len"])

    @property
    def max_draft_tokens(self) -> int:
        return int(self.data["max_draft_tokens"])


def read_manifest(bundle: str | Path, verify_checksums: bool = True) -> Manifest:
    root = Path(bundle)
    if not root.is_dir():
        raise BundleError(f"bundle {root} does not exist (create one with `specrt compile`)")
    mpath = root / MANIFEST
    if not mpath.exists():
        raise BundleError(f"{root} has no {MANIFEST}: not a specrt bundle (create one with `specrt compile`)")
    try:
        data = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{mpath} is not valid JSON ({exc}); recompile the bundle") from None
    if data.get("format") != FORMAT_NAME:
        raise BundleError(f"{mpath}: format is {data.get('format')!r}, expected {FORMAT_NAME!r}")
    version = data.get("format_version")
    if version != BUNDLE_FORMAT_VERSION:
        raise VersionMismatch(
            f"bundle format version {version} but this specrt ({__version__}) reads version "
            f"{BUNDLE_FORMAT_VERSION}: recompile with `specrt compile`"
        )
    for key in ("models", "files", "max_seq_len", "max_draft_tokens", "tokenizer"):
        if key not in data:
            raise BundleError(f"{mpath} lacks the field {key!r}; recompile the bundle")
    if "target" not in data["models"]:
        raise BundleError(f"{mpath} has no target model")
    for rel, meta in data["files"].items():
        path = root / check_relative(rel)
        if not path.is_file():
            raise BundleError(f"bundle file {rel} listed in the manifest is missing; recompile the bundle")
        size = path.stat().st_size
        if size != meta["size"]:
            raise ChecksumMismatch(
                f"bundle file {rel} has {size} bytes, manifest says {meta['size']} (truncated or modified); "
                "recompile the bundle"
            )
        if verify_checksums:
            digest = sha256_file(path)
            if digest != meta["sha256"]:
                raise ChecksumMismatch(
                    f"bundle file {rel} has sha256 {digest[:16]}..., manifest says {meta['sha256'][:16]}... "
                    "(corrupted or modified); recompile the bundle"
                )
    return Manifest(root, data)


def file_entries(root: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under `root` except the manifest, keyed by relative POSIX path."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(root).as_posix()
        out[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return out
