"""A bundle's JSON files are read as regular files of bounded size (specrt/core/jsonfile.py): a manifest.json that
is a FIFO hung `generate` and `inspect` forever, one linked to /dev/zero filled memory until the process was killed
(issue 49); both are now one BundleError naming the file."""

from __future__ import annotations

import os
import shutil

import pytest

from specrt.core.errors import BundleError


@pytest.mark.parametrize("make, kind", [(os.mkfifo, "a FIFO"),
                                        (lambda p: p.symlink_to("/dev/zero"), "a character device")])
def test_a_manifest_that_is_not_a_regular_file_is_refused_at_once(tmp_path, pair_bundle, make, kind):
    from specrt.bundle.manifest import manifest_json

    bundle = shutil.copytree(pair_bundle, tmp_path / "b")
    (bundle / "manifest.json").unlink()
    make(bundle / "manifest.json")
    with pytest.raises(BundleError, match=f"manifest.json is {kind}.*recompile the bundle"):
        manifest_json(bundle)
