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


def ort_fused_onnx(entry: dict[str, Any]) -> str | None:
    """The fused graph ONNX Runtime's CPU runner loads, or None when it must run the portable graph: a quantized
    model without a quantized fused graph (bundles written before the fused graph was quantized) runs its
    quantized portable graph rather than the unquantized fused one."""
    fused = ((entry.get("graphs") or {}).get("fused") or {}).get("onnx")
    if not entry.get("quantization"):
        return fused
    return quantized_onnx(entry, "fused")


def ort_min_rows(entry: dict[str, Any]) -> int:
    """Rows per call ONNX Runtime's CPU runners pad a target's decode calls to (`quantization.min_rows`,
    compiler/quantize.py): 2 for a quantized model at accuracy level 4 compiled batch-invariant, else 1."""
    return int((entry.get("quantization") or {}).get("min_rows", 1))
