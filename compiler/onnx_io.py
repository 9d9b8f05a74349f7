"""Writing ONNX graph files the way every bundle graph is stored: `NAME.onnx` plus one external-data file
`NAME.onnx.data` beside it (tensors over 1 KiB), replacing what was there."""

from __future__ import annotations

from pathlib import Path


def save_onnx(model, path: str | Path) -> Path:
    """Write `model` to `path` and its weights to `path`.data (both replaced). Returns `path`."""
    import onnx

    path = Path(path)
    for f in (path, Path(str(path) + ".data")):
        f.unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    return path
