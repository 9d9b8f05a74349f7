"""Plain-text layout helpers shared by the CLI and the benchmark report (no rich, no terminal access)."""

from __future__ import annotations

from typing import Iterable


def pack(phrases: Iterable[str], width: int, sep: str = "   ") -> list[str]:
    """Join phrases into lines no wider than `width`, never breaking inside a phrase."""
    lines: list[str] = []
    for p in phrases:
        if lines and len(lines[-1]) + len(sep) + len(p) <= width:
            lines[-1] += sep + p
        else:
            lines.append(p)
    return lines
