"""The draft head's runners: `open_head_runner` picks one for a generator's backend.

`HeadRunner` (ort/head_runner.py) runs the head's graph (`draft_head/head.onnx`) and its own KV cache on ONNX
Runtime's CPU provider; `TrtHeadRunner` (trt/head_runner.py) runs the bundle's head engine on the GPU with the same
contract. The proposer that drives them: runtime/proposers/head.py.
"""

from __future__ import annotations

from specrt.bundle.graph_io import HEAD_ENGINE_ROLE
from specrt.core.errors import InvalidArgument
from specrt.runtime.backends.ort.head_runner import HeadRunner


def open_head_runner(manifest, capacity: int, backend: str = "ort", device: str | None = None) -> HeadRunner:
    """The head's runner for a generator on `backend`: its TensorRT engine on the target's GPU when the backend is
    'trt' and the bundle has one (`engines.draft_head`), else ONNX Runtime's CPU provider (any backend: a TensorRT
    bundle compiled before head engines existed keeps its head on the CPU)."""
    if backend == "trt" and HEAD_ENGINE_ROLE in manifest.engines:
        from specrt.runtime.backends.trt.head_runner import TrtHeadRunner

        return TrtHeadRunner(manifest, capacity, device or "cuda:0")
    return HeadRunner(manifest, capacity)


def check_fused_head(manifest, target, backend: str) -> None:
    """A fused head reads the target's layers, which only the ONNX Runtime runners hand over (ort/layer_outputs.py):
    InvalidArgument on another backend (rather than drafting from zeros in their place)."""
    layers = manifest.draft_head.feature_layers
    if layers and target.hidden_layers != len(layers):
        raise InvalidArgument(f"the bundle's draft head is fused (it reads the target's layers {list(layers)}): it "
                              f"runs with backend 'ort' or 'ort-portable', not {backend!r}")
