"""Backends: one runner per model, all with the contract in base.py.

    "ort"     ONNX Runtime, CPU provider (the embedded default): the bundle's fused graph variant when it
              has one (ort/fused_runner.py; the quantized fused graph for a quantized model), else the
              portable graph
    "ort-portable"  ONNX Runtime, CPU provider, always the portable graph
    "torch"   PyTorch reference (the exported modules themselves)
    "trt"     TensorRT engines from the bundle (NVIDIA GPU; see trt/runner.py)
    "ort-cuda" / "ort-trt"  ONNX Runtime CUDA / TensorRT providers (onnxruntime-gpu)
    "auto"    trt when the bundle has engines and TensorRT + a GPU are present, else ort-cuda when
              onnxruntime-gpu and a GPU are, else ort, else torch
"""

from __future__ import annotations

import os
import warnings

from specrt.core.errors import BackendUnavailable, InvalidArgument
from specrt.runtime.backends.base import Runner
from specrt.runtime.backends.ort.runner import default_threads  # noqa: F401  (the Generator sizes its pools with it)

BACKENDS = ("auto", "ort", "ort-portable", "torch", "trt", "ort-cuda", "ort-trt")


def ort_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def ort_cuda_usable() -> bool:
    """onnxruntime-gpu with its CUDA provider, and a CUDA device to run it on (asked of torch where it is
    installed; without torch, the NVIDIA driver's device node). A CPU-only ONNX Runtime never imports torch."""
    try:
        import onnxruntime
    except ImportError:
        return False
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return False
    try:
        import torch
    except ImportError:
        return os.path.exists("/dev/nvidiactl")
    return torch.cuda.is_available()


def resolve_backend(backend: str, manifest) -> str:
    if backend not in BACKENDS:
        raise InvalidArgument(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if manifest.engines:
        from specrt.runtime.backends.trt.runner import trt_unavailable_reason

        reason = trt_unavailable_reason(manifest)
        if reason is None:
            return "trt"
        warnings.warn(f"bundle has TensorRT engines but {reason}; falling back to ONNX Runtime", stacklevel=3)
    if ort_available():
        lean = any(e.ort_kind("ort-cuda") in e.omitted for e in manifest.models.values())
        return "ort-cuda" if not lean and ort_cuda_usable() else "ort"  # lean: only the CPU's fused graph is there
    warnings.warn("ONNX Runtime is not installed; using the PyTorch reference backend", stacklevel=3)
    return "torch"


def opened_graph(manifest, role: str, backend: str) -> str | None:
    """The graph file `create_runner` opens for `role` on `backend` (None: TensorRT, which opens engines)."""
    entry = manifest.models[role]
    if backend in ("ort", "ort-portable", "ort-cuda", "ort-trt"):
        entry.require(entry.ort_kind(backend), f"--backend {backend}")
        if backend == "ort" and entry.ort_fused_onnx is not None:
            return entry.ort_fused_onnx
        return entry.ort_onnx
    if backend == "torch":
        entry.require("portable", "--backend torch")
        return entry.onnx
    return None


def files_to_verify(manifest, backend: str) -> set[str]:
    """Every listed file except the graph variants (and their weights) this backend never opens: an int4
    bundle's fp32 graphs are not hashed to run its int4 graph (1.1 GB of SmolLM2's 1.5 GB)."""
    files = set(manifest.files)
    opened = {opened_graph(manifest, role, backend) for role in manifest.models}
    if None in opened:
        return files
    for entry in manifest.models.values():
        for onnx, data in graph_files(entry).items():
            if onnx not in opened:
                files.discard(onnx)
                files.discard(data)
    return files


def graph_files(entry) -> dict[str, str | None]:
    """graph file -> its external weights file, for every graph the entry lists (variants, quantized)."""
    out = {entry.onnx: entry.onnx_data}
    for g in (entry.graphs or {}).values():
        out[g.onnx] = g.onnx_data
    if entry.quantization is not None:
        for g in entry.quantization.graphs.values():
            out[g.onnx] = g.onnx_data
    return out


def create_runner(manifest, role: str, backend: str, *, capacity: int, max_short_tokens: int,
                  threads: int | None = None, want_hidden: bool = False, device: str | None = None,
                  alternating: bool = False) -> Runner:
    entry = manifest.models[role]
    config = entry.decoder_config
    opened = opened_graph(manifest, role, backend)  # a graph a lean bundle left out: one line naming the option
    # a quantized bundle: ONNX Runtime runs the quantized graph
    onnx_path = manifest.path(opened) if opened is not None else None
    fused = entry.ort_fused_onnx
    if backend == "ort" and fused is not None:
        from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner

        return OrtFusedRunner(manifest.path(fused), config, capacity, max_short_tokens,
                              device=device or "cpu", threads=threads, want_hidden=want_hidden,
                              min_rows=entry.ort_min_rows if role == "target" else 1, alternating=alternating)
    if backend in ("ort", "ort-portable"):
        from specrt.runtime.backends.ort.runner import OrtRunner

        return OrtRunner(onnx_path, config, capacity, max_short_tokens, device=device or "cpu",
                         threads=threads, want_hidden=want_hidden,
                         min_rows=entry.ort_min_rows if role == "target" else 1, alternating=alternating)
    if backend in ("ort-cuda", "ort-trt"):
        from specrt.runtime.backends.ort.gpu_runner import OrtGpuRunner

        return OrtGpuRunner(onnx_path, config, capacity, max_short_tokens, provider=backend.split("-")[1],
                            device=device or "cuda:0", want_hidden=want_hidden)
    if backend == "torch":
        from specrt.runtime.backends.pytorch.runner import TorchRunner

        return TorchRunner(onnx_path, config, capacity, device=device or "cpu", threads=threads,
                           want_hidden=want_hidden)
    if backend == "trt":
        from specrt.runtime.backends.trt.runner import TrtRunner

        return TrtRunner(manifest, role, config, capacity, device=device or "cuda:0", want_hidden=want_hidden)
    raise BackendUnavailable(f"backend {backend!r} is not available")


BATCH_BACKENDS = ("ort-portable", "torch", "trt")  # the batch runners over the batched portable graph (backends/batch.py)


def create_batch_runner(manifest, role: str, backend: str, *, max_batch: int, threads: int | None = None,
                        want_hidden: bool = False, device: str | None = None, weights_from: Runner | None = None):
    """A `BatchRunner` (backends/batch.py) of `role` with `max_batch` slots: "ort-portable" (ONNX Runtime on the
    CPU), "torch" (the PyTorch reference, CPU or CUDA) or "trt" (the bundle's engine, built with `--max-batch` >=
    max_batch). `weights_from`: a loaded runner of the same model and backend (the Generator's) whose weights the
    batch runner uses instead of loading its own copy: torch shares the decoder module, trt the deserialized engine
    (contexts and stream of its own); ONNX Runtime sessions cannot share theirs, so ort-portable loads a copy."""
    if backend not in BATCH_BACKENDS:
        raise InvalidArgument(f"batched passes over the portable graph run on {', '.join(BATCH_BACKENDS)}, "
                              f"not {backend!r} (the CPU's continuous batching: Generator.engine)")
    entry = manifest.models[role]
    if backend == "torch":
        from specrt.runtime.backends.pytorch.runner import TorchBatchRunner

        decoder = getattr(weights_from, "decoder", None)
        return TorchBatchRunner(manifest.path(opened_graph(manifest, role, backend)), entry.decoder_config, max_batch,
                                manifest.max_seq_len, device=device or "cpu", want_hidden=want_hidden, decoder=decoder)
    if backend == "trt":
        from specrt.runtime.backends.trt.batch_runner import TrtBatchRunner

        return TrtBatchRunner(manifest, role, entry.decoder_config, max_batch, manifest.max_seq_len,
                              device=device or "cuda:0", want_hidden=want_hidden, engine_from=weights_from)
    from specrt.runtime.backends.ort.batch_runner import OrtBatchRunner

    return OrtBatchRunner(manifest.path(opened_graph(manifest, role, backend)), entry.decoder_config, max_batch,
                          manifest.max_seq_len, threads=threads, want_hidden=want_hidden)
