"""Writing a datastore (runtime/proposers/store.py) into a bundle: `specrt store` (specrt/cli/commands/store.py).

    add_to_bundle(bundle, store)   # bundle/store/{corpus,order}.npy, listed in manifest.json with their sha256

Never a half-written bundle: the files are written and hashed in a temporary folder inside the bundle
(`.store.tmp-XXXX`), the new manifest next to manifest.json; only then are they swapped in by three renames (the
old store/ moved aside, the new one renamed into place, manifest.json replaced; then the old one deleted). A failure
before the swap (bad input, a full disk, Ctrl-C) leaves the bundle as it was. Writers take turns on an flock of the
bundle directory. Only the new files are hashed:
the manifest keeps the other files' entries (a bundle of GiBs is not re-read).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from specrt.runtime.proposers.store import CORPUS_FILE, ORDER_FILE, Datastore

STORE_DIR = "store"


def write_store(store: Datastore, root: Path) -> list[Path]:
    """Write `store` as root/store/corpus.npy and root/store/order.npy; returns the paths."""
    paths = [Path(root) / CORPUS_FILE, Path(root) / ORDER_FILE]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    np.save(paths[0], store.corpus, allow_pickle=False)
    np.save(paths[1], store.order, allow_pickle=False)
    return paths


def add_to_bundle(bundle: Path, store: Datastore) -> None:
    """Write `store` into the bundle directory `bundle` (replacing any) and list it in the manifest."""
    bundle = Path(bundle)
    if not bundle.is_dir():
        from specrt.bundle.manifest import read_manifest

        read_manifest(bundle)  # BundleError: "bundle ... does not exist (...)"
    with _locked(bundle):
        _add(bundle, store)


@contextlib.contextmanager
def _locked(bundle: Path) -> Iterator[None]:
    """An exclusive lock on the bundle directory: two writers at once take turns (the last one's store stays)."""
    fd = os.open(bundle, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _add(bundle: Path, store: Datastore) -> None:
    from specrt.bundle.manifest import MANIFEST, read_manifest, sha256_file
    from specrt.bundle.parts import FileEntry
    from specrt.bundle.writer import ManifestDraft

    m = read_manifest(bundle, verify_checksums=False)  # presence and sizes checked; the files stay untouched
    draft = ManifestDraft.of(m)
    tmp = Path(tempfile.mkdtemp(prefix=f".{STORE_DIR}.tmp-", dir=bundle))
    new_manifest = bundle / f".{MANIFEST}.tmp-{os.getpid()}"
    old = bundle / f"{tmp.name}.old"
    try:
        files = {rel: entry for rel, entry in m.files.items() if not rel.startswith(f"{STORE_DIR}/")}
        for path in write_store(store, tmp):
            rel = path.relative_to(tmp).as_posix()
            files[rel] = FileEntry(sha256_file(path), path.stat().st_size, f"files[{rel!r}]")
        manifest = draft.manifest(dict(sorted(files.items())), bundle)  # validated before anything is swapped
        new_manifest.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
        _swap(bundle, tmp / STORE_DIR, old, new_manifest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        new_manifest.unlink(missing_ok=True)


def _swap(bundle: Path, new_store: Path, old: Path, new_manifest: Path) -> None:
    """Move bundle/store aside to `old`, `new_store` into its place, `new_manifest` over manifest.json."""
    from specrt.bundle.manifest import MANIFEST

    if (bundle / STORE_DIR).exists():
        os.replace(bundle / STORE_DIR, old)
    os.replace(new_store, bundle / STORE_DIR)
    os.replace(new_manifest, bundle / MANIFEST)
