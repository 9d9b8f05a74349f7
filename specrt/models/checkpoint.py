"""Read a Hugging Face format checkpoint directory without transformers.

`config.json` + single or sharded safetensors (`model.safetensors.index.json`) + `tokenizer.json`
+ optional `generation_config.json` (EOS ids, one or several).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from ..core.errors import CheckpointError
from . import Decoder, DecoderConfig, build_decoder, parse_config
from .config import eos_and_bos, read_json


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

        tensors: dict[str, torch.Tensor] = {}
        for f in self.weight_files:
            try:
                tensors.update(load_file(str(f)))
            except Exception as exc:  # safetensors raises its own error types for corrupt files
                raise CheckpointError(f"cannot read weights {f}: {exc}") from None
        module = build_decoder(self.config)
        module.load_hf_state_dict({k: v.to(dtype) for k, v in tensors.items()})
        return module.to(dtype).eval()


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


def _weight_files(path: Path) -> tuple[Path, ...]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index: {exc}") from None
        files = tuple(path / name for name in sorted(set(weight_map.values())))
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
