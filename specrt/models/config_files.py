"""Reading a checkpoint's JSON files: `read_json` (a JSON object or CheckpointError) and `eos_and_bos` (the EOS and
BOS ids of config.json / generation_config.json, typed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.core.errors import CheckpointError


def _ids(value: Any, key: str) -> tuple[int, ...]:
    """`eos_token_id`: an id or a list of ids (whole numbers; the vocabulary bound: DecoderConfig)."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(f"config: {key} must be a token id or a list of token ids, got {value!r}")
    return tuple(values)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a checkpoint's file (CheckpointError for anything else, core/jsonfile.py)."""
    from specrt.core.jsonfile import load_json

    data = load_json(path, CheckpointError)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def eos_and_bos(raw: dict[str, Any], generation: dict[str, Any] | None) -> tuple[tuple[int, ...], int | None]:
    """EOS ids (one or several) and BOS id; generation_config.json wins over config.json."""
    generation = generation or {}
    eos = _ids(generation.get("eos_token_id", raw.get("eos_token_id")), "eos_token_id")
    bos = _ids(generation.get("bos_token_id", raw.get("bos_token_id")), "bos_token_id")
    if len(bos) > 1:
        raise CheckpointError(f"config: bos_token_id must be one token id, got {list(bos)}")
    return eos, (bos[0] if bos else None)
