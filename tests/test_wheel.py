"""The installed package, not the tree: the wheel built from a copy of the repository holds every module of the
tree and every packaged asset, all under specrt/ (a hand-written package list once left out specrt.runtime.batch,
and batching failed after `pip install .`). CI (.ci/wheel) installs that wheel into a fresh venv and runs batching."""

from __future__ import annotations

import importlib.util
import runpy
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
_spec = importlib.util.spec_from_file_location("wheel_check", ROOT / "scripts" / "wheel_check.py")
wheel_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheel_check)
layers = wheel_check.layers

SOURCES = ("pyproject.toml", "setup.py", "README.md", "specrt", "compiler", "runtime", "recipes")


def test_setup_discovers_every_package_of_the_tree():
    package_dir, packages = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")["discover"]()
    assert package_dir == {p: d.relative_to(ROOT).as_posix() for p, d in layers.package_dirs().items()}
    assert set(layers.packages()) <= set(packages), set(layers.packages()) - set(packages)
    assert "specrt.runtime.batch" in packages and "specrt.assets.quality" in packages
    assert all(p == "specrt" or p.startswith("specrt.") for p in packages)


def _setuptools_too_old() -> bool:
    import setuptools

    return int(setuptools.__version__.split(".")[0]) < 77


@pytest.mark.skipif(_setuptools_too_old(), reason="needs setuptools >= 77 in this environment (the dev extra)")
def test_the_wheel_holds_every_module(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")}
                                         if (ROOT / name).is_dir() else {}))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    # setuptools' own warning for a package folder the configuration does not name
    assert "absent from the `packages` configuration" not in out.stdout + out.stderr
    wheel = next((tmp_path / "dist").glob("specrt-*.whl"))
    assert wheel_check.problems(wheel) == []
    names = zipfile.ZipFile(wheel).namelist()
    assert "specrt/runtime/batch/engine.py" in names and "specrt/assets/demo/target/model.safetensors" in names
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "specrt = specrt.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_check_names_what_a_wheel_lacks(tmp_path):
    """A wheel without runtime/batch/ and with a bare `runtime` package: both named."""
    wheel = tmp_path / "specrt-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for f in wheel_check.expected_files():
            if not f.startswith("specrt/runtime/batch/"):
                z.writestr(f, "")
        z.writestr("runtime/loop.py", "")
    found = wheel_check.problems(wheel)
    assert "missing from the wheel: specrt/runtime/batch/engine.py" in found
    assert "installs a top-level name other than specrt: runtime" in found
