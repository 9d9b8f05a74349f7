"""PyTorch reference runner: the very modules that were exported, with weights read back from the ONNX file.

The exporter keeps parameter names (`decoder.<hf name>`) as ONNX initializers, so the bundle needs no
second copy of the weights. CPU by default, CUDA when asked for and present.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from specrt.core.errors import BackendUnavailable, BundleError
from specrt.models import Decoder, build_decoder
from specrt.bundle.graph_io import PARAMETER_PREFIX, TRANSPOSED
from specrt.models.config import DecoderConfig
from specrt.runtime.kv_cache import KVCache
from specrt.runtime.backends.base import Runner
from specrt.runtime.backends.batch import BatchRunner



def check_torch_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailable(f"torch device {device!r} requested but CUDA is not available")


def decoder_from_onnx(onnx_path: Path, config: DecoderConfig) -> Decoder:
    """Rebuild the PyTorch decoder from the named initializers of an exported graph."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path), load_external_data=True)
    tensors = {}
    for init in model.graph.initializer:
        if init.name.startswith(PARAMETER_PREFIX):
            name, array = init.name[len(PARAMETER_PREFIX):], numpy_helper.to_array(init)
            if name.endswith(TRANSPOSED):  # stored in MatMul layout by the graph cleanup
                name, array = name[:-len(TRANSPOSED)], array.T
            tensors[name] = torch.from_numpy(array.copy())
    decoder = build_decoder(config)
    if config.tie_word_embeddings:  # the exporter names a tied weight after one of its users
        shared = tensors.get("lm_head.weight")
        for embed in ("model.embed_tokens.weight", "transformer.wte.weight"):
            if embed in decoder.hf_state_dict_keys() and embed not in tensors and shared is not None:
                tensors[embed] = shared
    try:
        decoder.load_hf_state_dict(tensors)
    except Exception as exc:
        raise BundleError(f"{onnx_path}: cannot rebuild the PyTorch module from the graph's weights: {exc}") from None
    return decoder.eval()


class TorchRunner(Runner):
    name = "torch"
    native = ("decoder", "_positions")
    supports_tree = True  # the decoder's own tree mask (models/layers.attend)

    def __init__(self, onnx_path: Path, config: DecoderConfig, capacity: int, device: str = "cpu",
                 threads: int | None = None, want_hidden: bool = False, decoder: Decoder | None = None) -> None:
        check_torch_device(device)
        if threads:
            torch.set_num_threads(threads)
        self.config = config
        self.device = torch.device(device)
        self.want_hidden = want_hidden
        self.decoder = (decoder or decoder_from_onnx(onnx_path, config)).to(self.device)
        self.cache = KVCache(config.num_layers, capacity, config.num_kv_heads, config.head_dim,
                             lambda shape: torch.zeros(shape, dtype=torch.float32, device=self.device))
        self._positions = torch.arange(capacity, device=self.device)[None, :]

    def _forward_tree(self, token_ids: np.ndarray, past: int, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return self._forward(token_ids, past, (mask, positions))

    @torch.inference_mode()
    def _forward(self, token_ids: np.ndarray, p: int, tree: tuple | None = None) -> np.ndarray:
        s = token_ids.size
        ids = torch.from_numpy(np.ascontiguousarray(token_ids, dtype=np.int64))[None, :].to(self.device)
        c = self.cache
        positions, tree_mask = self._positions[:, p:p + s], None
        if tree is not None:  # (ancestor mask [S, S], positions [S])
            tree_mask = torch.from_numpy(tree[0]).to(self.device)
            positions = torch.from_numpy(tree[1])[None, :].to(self.device)
        out = self.decoder(ids, positions, [k[:, :p] for k in c.keys], [v[:, :p] for v in c.values],
                           tree_mask=tree_mask)
        for i in range(self.config.num_layers):
            c.keys[i][:, p:p + s] = out.new_keys[i]
            c.values[i][:, p:p + s] = out.new_values[i]
        self.hidden_states = out.hidden_states[0].float().cpu().numpy() if self.want_hidden else None
        return out.logits[0].cpu().numpy()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "device": str(self.device), "torch": torch.__version__}


class TorchBatchRunner(BatchRunner):
    """The batch-runner contract (runtime/backends/batch.py) on the PyTorch reference: the decoder's own
    `past_lengths` masking (models/layers.attend), slot blocks as torch tensors on `device` (CPU or CUDA)."""

    name = "torch"

    def __init__(self, onnx_path: Path, config: DecoderConfig, max_batch: int, max_seq_len: int, device: str = "cpu",
                 want_hidden: bool = False, decoder: Decoder | None = None) -> None:
        super().__init__(config, max_batch, max_seq_len)
        check_torch_device(device)
        self.device, self.want_hidden = torch.device(device), want_hidden
        self.decoder = (decoder or decoder_from_onnx(onnx_path, config)).to(self.device)
        shape = (max_batch, self.past_rows, config.num_kv_heads, config.head_dim)
        self.keys = [torch.zeros(shape, device=self.device) for _ in range(config.num_layers)]  # L x [N, P, Hkv, D]
        self.values = [torch.zeros(shape, device=self.device) for _ in range(config.num_layers)]
        self._new = None

    @torch.inference_mode()
    def _run(self, ids: np.ndarray, positions: np.ndarray, lengths: np.ndarray, first: int = 0) -> np.ndarray:
        b = ids.shape[0]
        to = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        out = self.decoder(to(ids), to(positions), [k[first:first + b] for k in self.keys],
                           [v[first:first + b] for v in self.values], to(lengths))
        self._new = (out.new_keys, out.new_values)
        return out.logits.float().cpu().numpy(), out.hidden_states.float().cpu().numpy() if self.want_hidden else None

    @torch.inference_mode()
    def _commit(self, slots: np.ndarray, rows: np.ndarray, staged_slots: np.ndarray, src: np.ndarray) -> None:
        slots, rows, staged_slots, src = (torch.from_numpy(a).to(self.device) for a in (slots, rows, staged_slots, src))
        for caches, new in zip((self.keys, self.values), self._new):
            for cache, staged in zip(caches, new):
                cache[slots, rows] = staged[staged_slots, src]
