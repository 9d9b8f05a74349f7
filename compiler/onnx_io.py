"""Writing ONNX graph files the way every bundle graph is stored: `NAME.onnx` plus one external-data file
`NAME.onnx.data` beside it (tensors over 1 KiB), replacing what was there."""

from __future__ import annotations

from pathlib import Path


def _tensors(graph):
    """Every initializer of a graph and of its subgraphs (If / Loop / Scan bodies)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _tensors(sub)


def save_onnx(model, path: str | Path) -> Path:
    """Write `model` to `path` and its weights to `path`.data (both replaced). Returns `path`.

    The tensors are marked external here rather than by `onnx.save_model(save_as_external_data=True, location=...)`,
    which refuses when a file of that name exists in the current directory (not beside the model): compiling from
    a checkpoint folder that holds a `model.onnx.data` failed with FileExistsError."""
    import sys

    import onnx
    from onnx.external_data_helper import set_external_data

    path = Path(path)
    for f in (path, Path(str(path) + ".data")):
        f.unlink(missing_ok=True)
    for tensor in _tensors(model.graph):  # onnx's own rule: raw data of 1 KiB and over (its size as sys counts it)
        if tensor.HasField("raw_data") and sys.getsizeof(tensor.raw_data) >= 1024:
            set_external_data(tensor, path.name + ".data")
    onnx.save_model(model, str(path))
    return path
