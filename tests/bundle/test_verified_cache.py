"""Checksums verified once per file version (specrt/bundle/verified.py): an unchanged file is not hashed again
on the next load, and any change to it (same size, mtime put back) is still detected and refused."""

from __future__ import annotations

import os
import shutil

import pytest

import specrt.bundle.manifest as manifest_mod
import specrt.bundle.verified as verified
from specrt.bundle.manifest import read_manifest, verify_files
from specrt.core.errors import ChecksumMismatch


@pytest.fixture()
def bundle_copy(target_only_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(verified.ENV_OFF, raising=False)
    monkeypatch.setattr(verified, "SETTLE_NS", 0)  # the copy is fresh; see test_a_fresh_file_is_not_recorded
    dst = tmp_path / "bundle"
    shutil.copytree(target_only_bundle, dst)
    return dst


def hashed_during(monkeypatch, fn) -> list[str]:
    seen = []
    real = manifest_mod.sha256_file

    def counting(path, *args, **kwargs):
        seen.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(manifest_mod, "sha256_file", counting)
    fn()
    return seen


def test_an_unchanged_file_is_hashed_once(bundle_copy, monkeypatch):
    m = read_manifest(bundle_copy, verify_checksums=False)
    rels = sorted(m.files)
    assert len(hashed_during(monkeypatch, lambda: verify_files(m, rels))) == len(rels)
    assert hashed_during(monkeypatch, lambda: verify_files(m, rels)) == []


def test_a_modified_file_is_refused_even_with_its_mtime_put_back(bundle_copy, monkeypatch):
    m = read_manifest(bundle_copy, verify_checksums=False)
    rel = next(r for r in m.files if r.endswith(".onnx.data"))
    verify_files(m, [rel])  # recorded
    path = m.path(rel)
    st = os.stat(path)
    with open(path, "r+b") as f:  # same size, one byte flipped
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime as it was: ctime still moves
    with pytest.raises(ChecksumMismatch, match=rel):
        verify_files(m, [rel])


def test_a_replaced_file_is_hashed_again(bundle_copy, monkeypatch):
    m = read_manifest(bundle_copy, verify_checksums=False)
    rel = next(r for r in m.files if r.endswith(".json"))
    verify_files(m, [rel])
    path = m.path(rel)
    shutil.copy2(path, str(path) + ".new")
    os.replace(str(path) + ".new", path)  # same bytes, new inode
    assert hashed_during(monkeypatch, lambda: verify_files(m, [rel])) == [os.path.basename(path)]


def test_a_fresh_file_is_not_recorded(bundle_copy, monkeypatch):
    monkeypatch.setattr(verified, "SETTLE_NS", 10 ** 18)  # every file changed "just now"
    m = read_manifest(bundle_copy, verify_checksums=False)
    rel = sorted(m.files)[0]
    verify_files(m, [rel])
    assert len(hashed_during(monkeypatch, lambda: verify_files(m, [rel]))) == 1


def test_the_cache_can_be_turned_off(bundle_copy, monkeypatch):
    m = read_manifest(bundle_copy, verify_checksums=False)
    rel = sorted(m.files)[0]
    verify_files(m, [rel])
    monkeypatch.setenv(verified.ENV_OFF, "1")
    assert len(hashed_during(monkeypatch, lambda: verify_files(m, [rel]))) == 1

