"""Read a Hugging Face format checkpoint directory without transformers.

`config.json` + single or sharded safetensors (`model.safetensors.index.json`) + `tokenizer.json`
+ optional `generation_config.json` (EOS ids, one or several).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from specrt.core.errors import CheckpointError
from specrt.models import Decoder, DecoderConfig, build_decoder, parse_config
from specrt.models.config_files import eos_and_bos, read_json


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: DecoderConfig
    raw_config: dict[str, Any]
    weight_files: tuple[Path, ...]

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"

    def load_decoder(self, dtype: torch.dtype = torch.float32) -> Decoder:
        """Build the module and load its weights (converted to `dtype`), in eval mode."""
        from safetensors.torch import load_file

        check_fits_in_memory(self.config, self.path, dtype)
        tensors: dict[str, torch.Tensor] = {}
        for f in self.weight_files:
            try:
                tensors.update(load_file(str(f)))
            except Exception as exc:  # safetensors raises its own error types for corrupt files
                raise CheckpointError(f"cannot read weights {f}: {exc}") from None
        check_finite(tensors, self.path)
        module = build_decoder(self.config)
        module.load_hf_state_dict({k: v.to(dtype) for k, v in tensors.items()})
        return module.to(dtype).eval()


def estimate_parameters(c: DecoderConfig) -> int:
    """Parameter count implied by the config (embeddings, attention, gated MLP, lm_head unless tied)."""
    h, kv = c.hidden_size, c.num_kv_heads * c.head_dim
    attn = h * c.num_heads * c.head_dim * 2 + h * kv * 2
    mlp = 3 * h * c.intermediate_size
    embed = c.vocab_size * h * (1 if c.tie_word_embeddings else 2)
    return embed + c.num_layers * (attn + mlp + 4 * h)


def check_fits_in_memory(c: DecoderConfig, where: Path, dtype: torch.dtype) -> None:
    """Refuse (before allocating) a config whose weights, held about twice during loading and export,
    cannot fit in available memory."""
    import psutil

    need = 2 * estimate_parameters(c) * torch.empty((), dtype=dtype).element_size()
    available = psutil.virtual_memory().available
    if need > available:
        raise CheckpointError(f"{where}/config.json describes ~{estimate_parameters(c) / 1e9:.3g}B parameters: "
                              f"loading needs ~{need / 2**30:.1f} GiB, {available / 2**30:.1f} GiB are available")


def check_finite(tensors: dict[str, torch.Tensor], where: Path) -> None:
    """Refuse NaN / Inf weights, naming the first bad tensor."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(f"weight {name} in {where} has {bad} non-finite values (NaN/Inf): "
                                  "the checkpoint is corrupt; refusing to compile it")


def open_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    raw = read_json(path / "config.json")
    gen_path = path / "generation_config.json"
    generation = read_json(gen_path) if gen_path.exists() else None
    config = parse_config(raw)
    eos, bos = eos_and_bos(raw, generation)
    config = dataclasses.replace(config, eos_token_ids=eos, bos_token_id=bos)
    if not (path / "tokenizer.json").exists():
        raise CheckpointError(f"{path} has no tokenizer.json (a `tokenizers` fast tokenizer file is required)")
    return Checkpoint(path=path, config=config, raw_config=raw, weight_files=_weight_files(path))


def _shard_path(root: Path, name: str) -> Path:
    """A shard named by the index: a plain relative name that stays inside the checkpoint directory."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or name.startswith(("/", "\\")) or ":" in name:
        raise CheckpointError(f"safetensors index names the shard {name!r}: shard paths must be relative and stay "
                              f"inside {root}")
    real = os.path.realpath(root / name)
    if not any(os.path.commonpath([allowed, real]) == allowed for allowed in _shard_roots(root)):
        raise CheckpointError(f"shard {name} resolves to {real}, outside the checkpoint {root}")
    return root / name


def _shard_roots(root: Path) -> tuple[str, ...]:
    """Where a shard may really lie: inside the checkpoint directory, or, in the Hugging Face hub cache layout
    (REPO/snapshots/REVISION/NAME linked to REPO/blobs/HASH, as `huggingface-cli download` leaves a model), in
    that repository's blobs folder."""
    snapshot = Path(os.path.abspath(root))
    if snapshot.parent.name == "snapshots":
        return os.path.realpath(root), os.path.realpath(snapshot.parent.parent / "blobs")
    return (os.path.realpath(root),)


def _weight_files(path: Path) -> tuple[Path, ...]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")  # a regular file holding a JSON object (config.py)
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names")
        files = tuple(_shard_path(path, name) for name in sorted(set(weight_map.values())))
    elif (path / "model.safetensors").exists():
        files = (path / "model.safetensors",)
    else:
        raise CheckpointError(
            f"{path} has no weights: expected model.safetensors or model.safetensors.index.json "
            "(PyTorch .bin checkpoints are not read; convert them with save_pretrained(safe_serialization=True))"
        )
    for f in files:
        if not f.exists():
            raise CheckpointError(f"weight shard {f} listed in the index is missing")
    return files
