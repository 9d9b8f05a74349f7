"""`specrt inspect` on a bundle that fails its checks: read the manifest anyway, check every listed file
(present, size, sha256) and report each failure, so a tampered bundle is described, not refused.
`load`, `generate`, `serve` and `bench` still refuse such a bundle (bundle.read_manifest)."""

from __future__ import annotations

from pathlib import Path

from specrt.bundle.manifest import Manifest, manifest_json, read_manifest, sha256_file
from specrt.bundle.parts import FileEntry
from specrt.core.errors import BundleError


def read_for_inspect(bundle: str | Path) -> tuple[Manifest, list[str]]:
    """(manifest, failed checks). Raises the loader's error when the manifest itself cannot be read: only
    failures of the files (missing, size, sha256, paths, graphs) are described instead of refused."""
    try:
        return read_manifest(bundle, verify_checksums=True), []
    except BundleError as exc:
        root = Path(bundle)
        try:
            manifest = Manifest.from_dict(manifest_json(root), root=root)
        except BundleError:
            raise exc from None
        failures = file_failures(root, manifest.files)
        return manifest, failures or [str(exc)]


def file_failures(root: Path, files: dict[str, FileEntry]) -> list[str]:
    out = []
    for rel, meta in files.items():
        path = root / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            out.append(f"{rel}: path outside the bundle")
        elif not path.is_file():
            out.append(f"{rel}: missing")
        elif path.stat().st_size != meta.size:
            out.append(f"{rel}: {path.stat().st_size} bytes, manifest says {meta.size}")
        elif sha256_file(path) != meta.sha256:
            out.append(f"{rel}: sha256 differs from the manifest (corrupted or modified)")
    return out


def memory_notes(manifest: Manifest, max_seq_len: int | None) -> list[str]:
    notes = []
    if not manifest.engines:
        notes.append("CPU plan (ONNX Runtime): this bundle has no TensorRT engines, so no GPU workspace is counted")
    if max_seq_len is not None and max_seq_len > manifest.max_seq_len:
        notes.append(f"--max-seq-len {max_seq_len} is above the bundle's max_seq_len {manifest.max_seq_len}: this plans "
                     f"a bundle recompiled with `specrt compile --max-seq-len {max_seq_len}`; this one stops at "
                     f"{manifest.max_seq_len}")
    return notes
