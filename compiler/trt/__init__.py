"""specrt.compiler.trt: ONNX bundle -> TensorRT engines, and everything about them that needs no GPU.

    precision.py  fp32 ONNX graph -> fp16 / bf16 ONNX graph (TensorRT 11 is strongly typed)   CPU
    support.py    is an ONNX graph within what TensorRT's ONNX parser supports?              CPU
    memory.py     memory plan per model and device, --gpu-memory-budget check, parse_size    CPU
    compat.py     engine facts in the manifest vs the installed TensorRT / GPU              CPU
    build.py      network_from_onnx -> config_for_profiles -> engine_from_network -> save   TensorRT
    cli.py        `specrt compile --backend trt ...` options and the compile step          both

TensorRT is import-optional: nothing here imports it at module level. `import_trt()` is the one place
that does, and turns its absence into BackendUnavailable.
"""

from __future__ import annotations

from ...core.errors import BackendUnavailable

INSTALL_HINT = "install specrt[gpu] on a machine with an NVIDIA GPU: pip install 'specrt[gpu]'"


def import_trt():
    """Return the `tensorrt` module, or raise BackendUnavailable with the install command."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BackendUnavailable(f"TensorRT is not installed ({exc}): {INSTALL_HINT}") from None
    except Exception as exc:  # e.g. the NVIDIA placeholder package, or missing CUDA libraries
        raise BackendUnavailable(f"TensorRT cannot be imported ({type(exc).__name__}: {exc}): {INSTALL_HINT}") from None
    return trt


def trt_import_error() -> str | None:
    """None when `import tensorrt` works, else the reason (one line)."""
    try:
        import_trt()
    except BackendUnavailable as exc:
        return str(exc)
    return None


def cuda_device_error(device: str = "cuda:0") -> str | None:
    """None when torch sees the CUDA device `device`, else the reason (one line)."""
    import torch

    if not device.startswith("cuda"):
        return f"device {device!r} is not a CUDA device (use cuda or cuda:N)"
    if not torch.cuda.is_available():
        return "no NVIDIA GPU is visible to PyTorch (torch.cuda.is_available() is False)"
    index = torch.device(device).index or 0
    if index >= torch.cuda.device_count():
        return f"device {device} does not exist: {torch.cuda.device_count()} CUDA device(s) visible"
    return None
