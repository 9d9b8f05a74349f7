"""Reading JSON files a user hands us (configs, manifests, resume metadata): one rule, one clear error.

Every failure a hostile file can cause in `json.loads` (missing, unreadable, not UTF-8, not JSON, nested so
deeply that the parser recurses past Python's limit) becomes `error(message)` naming the path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

JSON_MAX_BYTES = 64 << 20  # manifests, configs, head configs: a few KB to a few MB


def parse_json(text: str | bytes, where: str, error: Callable[[str], Exception]) -> Any:
    """`json.loads(text)`, with every parse failure raised as `error("<where> is not valid JSON (...)")`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{where} is nested too deeply to be a specrt file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{where} is not valid UTF-8 JSON ({exc})") from None


def load_json(path: str | Path, error: Callable[[str], Exception]) -> Any:
    """The parsed JSON file at `path` (see parse_json); a missing or unreadable file is `error` too, and so is
    anything but a regular file of at most JSON_MAX_BYTES (a FIFO in a bundle would block forever, a link to
    /dev/zero would fill memory): read by specrt/core/textfile.py's reader."""
    from specrt.core.errors import InvalidArgument
    from specrt.core.textfile import read_user_bytes

    path = Path(path)
    if not path.exists():
        raise error(f"{path} not found")
    try:
        data = read_user_bytes(path, "JSON file", JSON_MAX_BYTES)
    except InvalidArgument as exc:
        raise error(str(exc)) from None
    return parse_json(data, str(path), error)
