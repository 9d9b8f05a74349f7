"""Plain-text layout helpers shared by the CLI and the benchmark report (no rich, no terminal access)."""

from __future__ import annotations

from typing import Any, Iterable


def pack(phrases: Iterable[str], width: int, sep: str = "   ") -> list[str]:
    """Join phrases into lines no wider than `width`, never breaking inside a phrase."""
    lines: list[str] = []
    for p in phrases:
        if lines and len(lines[-1]) + len(sep) + len(p) <= width:
            lines[-1] += sep + p
        else:
            lines.append(p)
    return lines


def one_line(error: Any, limit: int = 300) -> str:
    """A library's message (ONNX Runtime's node dumps, torch.export's reports) as its first meaningful line, cut at
    `limit` characters; the exception's type name when it says nothing."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def flat_line(error: Any, limit: int = 300) -> str:
    """A message whose later lines matter (a regex error's carets and reason) on one line, cut at `limit`."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def lone_surrogate(text: str) -> str | None:
    """Where `text` holds a lone surrogate (U+D800..U+DFFF: JSON's "\\ud800" decodes to one), which UTF-8 cannot
    encode and tokenizers refuse with a TypeError: "U+D800 at character 3"; None for valid text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"U+{ord(text[exc.start]):04X} at character {exc.start}"
    return None
