"""What a built wheel must hold: every module of the tree (the walk of scripts/layers.py) and every packaged asset,
all under specrt/ (no bare top-level `compiler`, `runtime` or `recipes`).

    python scripts/wheel_check.py dist/specrt-*.whl    # exit 1, one line per problem

Used by tests/test_wheel.py and by CI (.ci/wheel), which installs the checked wheel into a fresh venv.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layers  # noqa: E402  (scripts/ is not a package)


def expected_files(root: Path = layers.ROOT) -> list[str]:
    """The paths inside a wheel of every .py module of the tree and every file under specrt/assets."""
    files = [name.replace(".", "/") + ("/__init__.py" if is_pkg else ".py") for name, is_pkg, _ in layers.modules(root)]
    assets = root / "specrt" / "assets"
    files += [p.relative_to(root).as_posix() for p in sorted(assets.rglob("*"))
              if p.is_file() and "__pycache__" not in p.parts]
    return files


def problems(wheel: Path, root: Path = layers.ROOT) -> list[str]:
    """One line per module or asset the wheel lacks and per top-level name other than specrt."""
    names = set(zipfile.ZipFile(wheel).namelist())
    found = [f"missing from the wheel: {f}" for f in expected_files(root) if f not in names]
    tops = sorted({n.split("/")[0] for n in names if n.split("/")[0] != "specrt" and ".dist-info" not in n})
    return found + [f"installs a top-level name other than specrt: {t}" for t in tops]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/wheel_check.py WHEEL")
    found = problems(Path(sys.argv[1]))
    for line in found:
        print(line, file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"{Path(sys.argv[1]).name}: every module of the tree and every asset, all under specrt/")
