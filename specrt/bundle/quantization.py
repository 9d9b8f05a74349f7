"""Which graph an ONNX Runtime runner loads for a model that `compile --quantize` quantized.

`models.<role>.quantization.graphs.<variant>.onnx` is the quantized graph (compiler/quantize_step.py);
the model's own `onnx` stays the unquantized graph for the TensorRT and PyTorch backends.
"""

from __future__ import annotations

from typing import Any


def quantized_onnx(entry: dict[str, Any], variant: str = "portable") -> str | None:
    """Relative path of the quantized `variant` graph of one model entry, or None when not quantized."""
    graph = ((entry.get("quantization") or {}).get("graphs") or {}).get(variant)
    return graph["onnx"] if graph else None


def ort_onnx(entry: dict[str, Any]) -> str:
    """The portable graph ONNX Runtime loads: the quantized one when there is one."""
    return quantized_onnx(entry) or entry["onnx"]
