"""Checks of `specrt compile`'s input directories before anything is loaded, with errors that name the
flag and say what the directory needs (a bundle passed as a checkpoint is recognised)."""

from __future__ import annotations

import os
from pathlib import Path

from specrt.core.errors import CheckpointError

CHECKPOINT_NEEDS = ("a Hugging Face checkpoint directory needs config.json, model.safetensors (or "
                    "model.safetensors.index.json) and tokenizer.json, as written by save_pretrained")

# the files a compile reads from a checkpoint directory when they exist (shards: specrt/models/checkpoint.py)
READ_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
              "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def check_checkpoint_dir(path: Path, flag: str) -> None:
    """Refuse `path` given as `flag` (e.g. --target) unless it looks like a Hugging Face checkpoint."""
    path = Path(path)
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(f"{flag} {path}: no such directory") from None
    except OSError as exc:  # a name too long for the file system, a symlink loop, ...
        raise CheckpointError(f"{flag} {path}: {exc.strerror or exc}") from None
    if flag != "--medusa" and path.is_file() and path.suffix.lower() in (".gguf", ".whl", ".zip"):
        return  # a GGUF source: checked by specrt.models.gguf_source when it is opened
    if not path.is_dir():
        raise CheckpointError(f"{flag} {path} is a file; {CHECKPOINT_NEEDS}")
    if (path / "manifest.json").exists():
        raise CheckpointError(f"{flag} {path} is a compiled specrt bundle, not a checkpoint: pass the checkpoint "
                              "directory it was compiled from (a bundle is used by generate, serve, bench, inspect)")
    if (path / "medusa_config.json").exists() and flag != "--medusa":
        raise CheckpointError(f"{flag} {path} holds Medusa heads, not a checkpoint: pass it as --medusa")
    if flag == "--medusa":
        if not (path / "medusa_config.json").exists():
            raise CheckpointError(f"--medusa {path} has no medusa_config.json: pass a directory written by "
                                  "`specrt train-medusa`")
        return
    missing = [name for name in ("config.json", "tokenizer.json") if not (path / name).exists()]
    if missing:
        gguf = sorted(p.name for p in path.glob("*.gguf"))
        hint = f"; it holds {gguf[0]}: pass that file itself as {flag}" if gguf else ""
        raise CheckpointError(f"{flag} {path} is not a checkpoint directory ({' and '.join(missing)} missing); "
                              f"{CHECKPOINT_NEEDS}{hint}")
    for name in READ_FILES:  # a directory (or FIFO) where a file belongs fails now, not after the export
        if (path / name).exists() and not (path / name).is_file():
            raise CheckpointError(f"{flag} {path}: {name} is not a regular file")
