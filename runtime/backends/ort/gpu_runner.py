"""ONNX Runtime on an NVIDIA GPU (onnxruntime-gpu): CUDAExecutionProvider or TensorrtExecutionProvider.

Same IOBinding scheme as the CPU runner, with the KV buffers in device memory (torch CUDA tensors as
the allocator): `past_*` bound to rows [0, P) and `new_*` to rows [P, P + S) of the same buffer, so the
provider writes new keys/values in place. `logits` is bound to a host buffer (ONNX Runtime copies it
once per call); `hidden_states` stays on the device unless asked for. `describe()` reports the provider
actually in use (`session.get_providers()[0]`): onnxruntime-gpu silently falls back to the CPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.profiles import PREFILL_CHUNK_MAX
from specrt.core.trt import cuda_device_error
from specrt.core.errors import BackendError, BackendUnavailable
from specrt.models.config import DecoderConfig
from specrt.runtime.kv_cache import KVCache
from specrt.runtime.backends.base import Runner
from specrt.runtime.backends.ort.threads import on_shared_pool
from specrt.runtime.backends.ort.runner import import_ort

PROVIDER_NAMES = {"cuda": "CUDAExecutionProvider", "trt": "TensorrtExecutionProvider"}
GPU_HINT = ("install onnxruntime-gpu on a machine with an NVIDIA GPU: pip uninstall -y onnxruntime && "
            "pip install 'specrt[gpu]' (never together with the cpu extra)")


def trt_ep_profile_options(config: DecoderConfig, capacity: int, max_new: int = PREFILL_CHUNK_MAX) -> dict[str, str]:
    """TensorrtExecutionProvider options: one profile covering S in [1, max_new], P in [0, capacity - 1]."""
    kv = f"{config.num_kv_heads}x{config.head_dim}"
    shapes = {"min": (1, 0), "opt": (1, capacity // 2), "max": (min(max_new, capacity), capacity - 1)}
    out = {}
    for which, (s, p) in shapes.items():
        items = [f"{graph_io.INPUT_IDS}:1x{s}", f"{graph_io.POSITION_IDS}:1x{s}"]
        for i in range(config.num_layers):
            items += [f"{graph_io.past_key(i)}:1x{p}x{kv}", f"{graph_io.past_value(i)}:1x{p}x{kv}"]
        out[f"trt_profile_{which}_shapes"] = ",".join(items)
    return out


def check_gpu_provider(ort, provider: str) -> str:
    """The provider's ONNX Runtime name, or BackendUnavailable naming what is installed."""
    if provider not in PROVIDER_NAMES:
        raise BackendUnavailable(f"unknown ONNX Runtime GPU provider {provider!r}: use 'cuda' or 'trt'")
    name = PROVIDER_NAMES[provider]
    available = ort.get_available_providers()
    if name not in available:
        raise BackendUnavailable(
            f"backend 'ort-{provider}' needs ONNX Runtime's {name}, but this onnxruntime "
            f"({ort.__version__}) offers only {', '.join(available)}: {GPU_HINT}")
    return name


class OrtGpuRunner(Runner):
    name = "ort-gpu"
    native = ("_binding", "session", "_ids", "_positions", "_logits", "_hidden")

    def __init__(self, onnx_path: Path, config: DecoderConfig, capacity: int, max_short_tokens: int,
                 provider: str = "cuda", device: str = "cuda:0", want_hidden: bool = False) -> None:
        ort = import_ort()
        provider_name = check_gpu_provider(ort, provider)
        reason = cuda_device_error(device)
        if reason:
            raise BackendUnavailable(f"backend 'ort-{provider}': {reason}; {GPU_HINT}")
        import torch

        self.name = f"ort-{provider}"
        self.device = torch.device(device)
        index = self.device.index or 0
        self.config, self.want_hidden, self._ort, self._torch = config, want_hidden, ort, torch
        options: dict[str, Any] = {"device_id": index}
        if provider == "trt":
            cache_dir = Path(os.environ.get("SPECRT_ORT_TRT_CACHE", Path.home() / ".cache" / "specrt" / "ort-trt"))
            cache_dir.mkdir(parents=True, exist_ok=True)
            options.update(trt_engine_cache_enable="True", trt_engine_cache_path=str(cache_dir),
                           **trt_ep_profile_options(config, capacity))
        providers = [(provider_name, options), ("CPUExecutionProvider", {})]
        if provider == "trt":
            providers.insert(1, ("CUDAExecutionProvider", {"device_id": index}))
        try:
            opts = ort.SessionOptions()
            on_shared_pool(opts)  # the process's one CPU pool, if any (threads.py): then no session may have its own
            self.session = ort.InferenceSession(str(onnx_path), opts, providers=providers)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime ({provider_name}) could not load {onnx_path}: {exc}") from None
        c = config
        self.cache = KVCache(c.num_layers, capacity, c.num_kv_heads, c.head_dim,
                             lambda shape: torch.zeros(shape, dtype=torch.float32, device=self.device))
        self._index = index
        self.max_short = max_short_tokens
        self._ids = torch.zeros((1, capacity), dtype=torch.int64, device=self.device)  # [1, capacity]
        self._positions = torch.arange(capacity, dtype=torch.int64, device=self.device)[None]  # [1, capacity]
        max_s = max(max_short_tokens, min(PREFILL_CHUNK_MAX, capacity))
        self._logits = np.empty((1, max_s, c.vocab_size), dtype=np.float32)  # host [1, S_max, V]
        self._hidden = torch.empty((1, max_s, c.hidden_size), dtype=torch.float32, device=self.device)
        self._binding = self.session.io_binding()

    def _bind_dev(self, bind, name: str, shape, ptr: int, dtype=np.float32) -> None:
        bind(name, "cuda", self._index, dtype, list(shape), ptr)

    def _forward(self, token_ids: np.ndarray, p: int) -> np.ndarray:
        s = token_ids.size
        c, b = self.config, self._binding
        if s > self._logits.shape[1]:
            self._logits = np.empty((1, s, c.vocab_size), dtype=np.float32)
            self._hidden = self._torch.empty((1, s, c.hidden_size), dtype=self._torch.float32, device=self.device)
        self._ids[0, :s].copy_(self._torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64)))
        self._bind_dev(b.bind_input, graph_io.INPUT_IDS, (1, s), self._ids.data_ptr(), np.int64)
        self._bind_dev(b.bind_input, graph_io.POSITION_IDS, (1, s), self._positions.data_ptr() + 8 * p, np.int64)
        kv = (c.num_kv_heads, c.head_dim)
        for i in range(c.num_layers):
            for name_in, name_out, buf in ((graph_io.past_key(i), graph_io.new_key(i), self.cache.keys[i]),
                                           (graph_io.past_value(i), graph_io.new_value(i), self.cache.values[i])):
                self._bind_dev(b.bind_input, name_in, (1, p, *kv), buf.data_ptr())  # rows [0, P)
                self._bind_dev(b.bind_output, name_out, (1, s, *kv), buf.data_ptr() + self.cache.row_offset(p))
        b.bind_output(graph_io.LOGITS, "cpu", 0, np.float32, [1, s, c.vocab_size], self._logits.ctypes.data)
        self._bind_dev(b.bind_output, graph_io.HIDDEN_STATES, (1, s, c.hidden_size), self._hidden.data_ptr())
        try:
            self._torch.cuda.synchronize(self.device)  # the id copy above ran on torch's stream
            self.session.run_with_iobinding(b)
        except Exception as exc:
            raise BackendError(f"ONNX Runtime run failed (S={s}, P={p}): {exc}") from None
        self.hidden_states = self._hidden[0, :s].cpu().numpy() if self.want_hidden else None
        return self._logits[0, :s]

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "provider": self.session.get_providers()[0], "device": str(self.device),
                "onnxruntime": self._ort.__version__}
