"""No module over 300 lines (issue #50; STYLE.md: "when a file grows a second responsibility, split it"): every .py
file of the package (specrt/, runtime/, compiler/, recipes/, as pyproject maps them) and of scripts/."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import layers  # noqa: E402  (scripts/layers.py: the tree's modules, read from pyproject's mapping)

MAX_LINES = 300
# None over the limit; an entry that is no longer over it fails the test too, so the list only shrinks.
ALLOWED: set = set()


def line_counts(root: Path = ROOT) -> dict[str, int]:
    paths = [path for _, _, path in layers.modules(root)] + sorted((root / "scripts").glob("*.py"))
    return {p.relative_to(root).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}


def test_no_module_over_300_lines():
    counts = line_counts()
    assert len(counts) > 200 and "scripts/layers.py" in counts and "runtime/loop.py" in counts
    over = {rel: n for rel, n in counts.items() if n > MAX_LINES}
    new = sorted(f"{rel} ({n} lines)" for rel, n in over.items() if rel not in ALLOWED)
    assert not new, f"modules over {MAX_LINES} lines (split them by responsibility): {', '.join(new)}"
    done = sorted(ALLOWED - set(over))
    assert not done, f"no longer over {MAX_LINES} lines: remove from ALLOWED: {done}"


def test_a_long_module_is_seen(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {"specrt" = "specrt"}\n')
    (tmp_path / "specrt").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "specrt" / "__init__.py").write_text("")
    (tmp_path / "specrt" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "scripts" / "tool.py").write_text("x = 1\n" * MAX_LINES)
    assert line_counts(tmp_path) == {"specrt/__init__.py": 0, "specrt/long.py": MAX_LINES + 1,
                                     "scripts/tool.py": MAX_LINES}
