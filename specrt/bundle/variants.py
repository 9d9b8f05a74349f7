"""Graph variants per model in a bundle (read side): `portable` always, `fused` (ONNX Runtime contrib ops)
optionally. The manifest layout is documented in specrt/compiler/variants.py, which writes it."""

from __future__ import annotations

from typing import Any


def graph_entry(entry: dict[str, Any], variant: str) -> dict[str, Any] | None:
    """The manifest entry of `variant` for one model (None when absent); tolerates bundles without variants."""
    graphs = entry.get("graphs")
    if graphs is None:
        return {"onnx": entry["onnx"], "onnx_data": entry.get("onnx_data")} if variant == "portable" else None
    return graphs.get(variant)
