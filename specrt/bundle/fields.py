"""Field checks and JSON helpers shared by the manifest dataclasses (schema.py, entries.py).

Every check raises `ManifestError` naming the manifest key (`models.target.onnx`, `files['x'].size`) and the
bad value; the dataclasses call them from `__post_init__` (values) and `from_dict` (containers).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from specrt.core.errors import ManifestError

RECOMPILE = "recompile the bundle"


def check_int(value: Any, key: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ManifestError(f"manifest key {key!r} must be an integer in {rng}, got {value!r}; {RECOMPILE}")
    return value


def check_dict(value: Any, key: str) -> dict:
    if not isinstance(value, dict):
        raise ManifestError(f"manifest key {key!r} must be an object, got {type(value).__name__}; {RECOMPILE}")
    return value


def check_list(value: Any, key: str) -> list | tuple:
    if not isinstance(value, (list, tuple)):
        raise ManifestError(f"manifest key {key!r} must be a list, got {type(value).__name__}; {RECOMPILE}")
    return value


def check_str(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ManifestError(f"manifest key {key!r} must be a non-empty string, got {value!r}; {RECOMPILE}")
    return value


def check_optional_str(value: Any, key: str) -> str | None:
    return None if value is None else check_str(value, key)


def check_ids(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                                   for v in value):
        raise ManifestError(f"manifest key {key!r} must be a list of token ids, got {value!r}")
    return tuple(value)


def unknown_keys(raw: Mapping[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """Keys this version does not know: kept as they are (a newer writer's additions are not an error)."""
    known = set(known)
    return {k: v for k, v in raw.items() if k not in known}


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def plain(value: Any) -> Any:
    """JSON-ready copy: entries via `to_dict`, tuples as lists, mappings and lists recursively."""
    if hasattr(value, "to_dict"):
        return plain(value.to_dict())
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def emit(pairs: Iterable[tuple[str, Any]], keep_null: Iterable[str] = (), extra: Mapping[str, Any] | None = None
         ) -> dict[str, Any]:
    """An ordered JSON object from (key, value) pairs: None values are left out (the key was absent) unless the
    key is in `keep_null` (the writer records an explicit null), then the unknown keys read from the file."""
    keep = set(keep_null)
    out = {k: plain(v) for k, v in pairs if v is not None or k in keep}
    out.update(plain(dict(extra or {})))
    return out
