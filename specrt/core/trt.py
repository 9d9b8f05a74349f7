"""specrt.core.trt: the one place that imports `tensorrt` (layer: shared base).

TensorRT is import-optional: nothing else imports it at module level. `import_trt()` turns its absence
into BackendUnavailable; `make_logger` keeps TensorRT warnings for error messages; `installed_facts`
describes the installed TensorRT / CUDA / GPU (recorded at build, compared at load).
"""

from __future__ import annotations

from typing import Any

from specrt.core.errors import BackendUnavailable

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

def make_logger(trt, lines: list[str]):
    """A TensorRT ILogger that keeps warnings and errors in `lines` (for error messages)."""

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity, msg) -> None:
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                lines.append(str(msg))

    return _Logger()


def installed_facts(device: str = "cuda:0") -> dict[str, Any]:
    """TensorRT version, CUDA version, GPU name and compute capability of `device` (needs both)."""
    import torch

    trt = import_trt()
    props = torch.cuda.get_device_properties(torch.device(device))
    return {"tensorrt_version": trt.__version__, "cuda_version": torch.version.cuda,
            "gpu_name": props.name, "compute_capability": f"{props.major}.{props.minor}"}
