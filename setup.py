"""Packages discovered from the tree, not listed: pyproject.toml's `[tool.setuptools] package-dir` maps compiler/,
runtime/ and recipes/ into specrt.* (the one place the mapping is stated), and every package under each mapped
folder is found here. setuptools' declarative `packages.find` cannot put a prefix on a folder's packages (it would
install a bare `compiler`), hence these lines. The data packages under specrt/assets (no __init__.py) are found as
namespace packages; their files come from `[tool.setuptools.package-data]`. tests/test_wheel.py builds the wheel and
finds every module of the tree in it.
"""

import sys
from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the build requirement `tomli` (pyproject.toml)
    import tomli as tomllib

HERE = Path(__file__).resolve().parent


def discover(root: Path = HERE) -> tuple[dict[str, str], list[str]]:
    """(package_dir, packages): every regular package under each mapped folder, prefixed with its import name."""
    package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    packages = []
    for prefix, folder in package_dir.items():
        packages += [prefix] + [f"{prefix}.{p}" for p in find_packages(str(root / folder))]
    data = find_namespace_packages(str(root / "specrt" / "assets"), exclude=["*__pycache__*"])
    packages += [f"specrt.assets.{p}" for p in data]
    return package_dir, sorted(set(packages))


if __name__ == "__main__":
    package_dir, packages = discover()
    setup(package_dir=package_dir, packages=packages)
