"""The bundle: a directory with `manifest.json`, ONNX graphs, configs, tokenizer and (optionally) engines.

`compile` writes it (writer.py, called by specrt.compiler.pipeline); `load` trusts it only after
`read_manifest` has validated the format version and the manifest's values (the `Manifest` dataclass,
schema.py), every path (relative, no `..`, inside the root after symlinks), every file's sha256, the
graphs' shapes and the memory the KV caches need (checks.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

from specrt.core.errors import BundleError, ChecksumMismatch
from specrt.core.jsonfile import load_json
from specrt.bundle.checks import check_graphs, check_memory
from specrt.bundle.head_vocab import head_vocab_ids
from specrt.bundle.paths import check_relative, resolve_inside
from specrt.bundle.schema import FORMAT_NAME, Manifest

__all__ = ["FORMAT_NAME", "MANIFEST", "Manifest", "file_entries", "has_demo_mark", "listed_files", "manifest_json",
           "read_manifest", "sha256_file", "verify_files"]

MANIFEST = "manifest.json"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest_json(root: Path) -> Any:
    """The parsed manifest.json of `root`, unvalidated (BundleError when missing or not UTF-8 JSON). For
    tools that must describe or recognise a bundle that fails its checks; everything else uses read_manifest."""
    mpath = Path(root) / MANIFEST
    try:
        os.lstat(mpath)
    except (FileNotFoundError, NotADirectoryError):
        raise BundleError(f"{root} has no {MANIFEST}: not a specrt bundle (create one with `specrt compile`)") from None
    except OSError as exc:  # a name too long for the file system, a symlink loop, ...
        raise BundleError(f"bundle {root}: {exc.strerror or exc}") from None
    if not mpath.exists():
        raise BundleError(f"{root} has no {MANIFEST}: not a specrt bundle (create one with `specrt compile`)")
    return load_json(mpath, lambda msg: BundleError(f"{msg}; recompile the bundle"))


def listed_files(root: Path) -> set[str] | None:
    """The paths the manifest of `root` lists when it looks like a specrt bundle (format name and a file list;
    nothing else is validated), else None. For `compile --force`, which may replace a broken bundle."""
    try:
        data = json.loads((Path(root) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME or not isinstance(data.get("files"), dict):
        return None
    return set(data["files"])


def has_demo_mark(root: Path) -> bool:
    """True when the manifest of `root` has a `demo` entry (a bundle `specrt demo` may replace), even when the
    bundle fails its checks."""
    try:
        data = json.loads((Path(root) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError, RecursionError):
        return False
    return isinstance(data, dict) and "demo" in data


# the folders `specrt demo` writes (artifacts/<name>) and the command that makes each
DEMO_BUNDLES = {"demo": "specrt demo --offline", "demo-smollm2": "specrt demo"}


def read_manifest(bundle: str | Path, verify_checksums: bool = True) -> Manifest:
    """The bundle's validated `Manifest`: values, file list, sizes, sha256 (unless `verify_checksums` is
    False), graph shapes and memory. Raises BundleError / ChecksumMismatch / VersionMismatch / ManifestError."""
    root = Path(bundle)
    try:
        is_dir = root.is_dir()
    except OSError as exc:  # a name too long for the file system (Path.is_dir raises that one)
        raise BundleError(f"bundle {root}: {exc.strerror or exc}") from None
    if not is_dir:
        make = DEMO_BUNDLES.get(root.name)  # the docs' examples name the demo's bundles
        hint = f"`{make}` makes it" if make else "create one with `specrt compile`"
        what = "is a file, not a bundle directory" if root.exists() else "does not exist"
        raise BundleError(f"bundle {root} {what} ({hint})")
    manifest = Manifest.from_dict(manifest_json(root), root=root, source=str(root / MANIFEST))
    for rel, meta in manifest.files.items():
        path = resolve_inside(root, check_relative(rel))
        if not path.is_file():
            raise BundleError(f"bundle file {rel} listed in the manifest is missing; recompile the bundle")
        size = path.stat().st_size
        if size != meta.size:
            raise ChecksumMismatch(
                f"bundle file {rel} has {size} bytes, manifest says {meta.size} (truncated or modified); "
                "recompile the bundle"
            )
        if verify_checksums:
            digest = sha256_file(path)
            if digest != meta.sha256:
                raise ChecksumMismatch(
                    f"bundle file {rel} has sha256 {digest[:16]}..., manifest says {meta.sha256[:16]}... "
                    "(corrupted or modified); recompile the bundle"
                )
    check_graphs(root, manifest)
    if manifest.draft_head is not None:
        head_vocab_ids(manifest)
    check_memory(manifest)
    return manifest


def file_entries(root: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under `root` except the manifest, keyed by relative POSIX path."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(root).as_posix()
        out[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return out


def verify_files(manifest: Manifest, rels: Iterable[str]) -> None:
    """sha256 of the listed files `rels` against the manifest (read_manifest with verify_checksums=False has
    checked every file's presence and size already). A file verified before and unchanged since is not hashed
    again (verified.py: same device, inode, size, mtime and ctime). Raises ChecksumMismatch naming the first bad
    file."""
    from specrt.bundle.verified import VerifiedCache, file_identity

    cache = VerifiedCache(manifest.root)
    for rel in sorted(set(rels)):
        path, expected = manifest.path(rel), manifest.files[rel].sha256
        if cache.known(path, expected):
            continue
        identity = file_identity(path)
        digest = sha256_file(path)
        if digest != expected:
            raise ChecksumMismatch(
                f"bundle file {rel} has sha256 {digest[:16]}..., manifest says {expected[:16]}... "
                "(corrupted or modified); recompile the bundle"
            )
        cache.record(path, expected, identity)
    cache.save()
