"""The ONNX Runtime this process runs: `import_ort` (with the one-distribution check) and the default thread count.

Apart from the runner (runner.py) so that the process-wide thread pool (threads.py) and the runner's session
options, which each need the other's half, both import it.
"""

from __future__ import annotations

import os
from pathlib import Path

from specrt.core.errors import BackendUnavailable


def import_ort():
    try:
        import onnxruntime as ort
    except ImportError:
        raise BackendUnavailable(
            "ONNX Runtime is not installed: pip install 'specrt[cpu]' (or 'specrt[gpu]' on NVIDIA GPUs)"
        ) from None
    check_single_ort_distribution(ort)
    return ort


def check_single_ort_distribution(ort=None) -> None:
    """onnxruntime and onnxruntime-gpu share one directory; both installed is a broken environment. Read from the
    `*.dist-info` folders beside the imported package (importlib.metadata costs ~70 ms of a cold start)."""
    found = []
    if ort is not None and getattr(ort, "__file__", None):
        site = Path(ort.__file__).resolve().parent.parent
        for dist, pattern in (("onnxruntime", "onnxruntime-*.dist-info"), ("onnxruntime-gpu", "onnxruntime_gpu-*.dist-info")):
            if any(site.glob(pattern)):
                found.append(dist)
    else:
        from importlib import metadata

        for dist in ("onnxruntime", "onnxruntime-gpu"):
            try:
                metadata.version(dist)
                found.append(dist)
            except metadata.PackageNotFoundError:
                pass
    if len(found) > 1:
        raise BackendUnavailable(
            "both onnxruntime and onnxruntime-gpu are installed; they overwrite each other. Fix: "
            "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'specrt[cpu]' (or 'specrt[gpu]')"
        )


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
