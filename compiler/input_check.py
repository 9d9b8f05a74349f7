"""Checks of `specrt compile`'s input directories before anything is loaded, with errors that name the
flag and say what the directory needs (a bundle passed as a checkpoint is recognised)."""

from __future__ import annotations

from pathlib import Path

from specrt.core.errors import CheckpointError

CHECKPOINT_NEEDS = ("a Hugging Face checkpoint directory needs config.json, model.safetensors (or "
                    "model.safetensors.index.json) and tokenizer.json, as written by save_pretrained")


def check_checkpoint_dir(path: Path, flag: str) -> None:
    """Refuse `path` given as `flag` (e.g. --target) unless it looks like a Hugging Face checkpoint."""
    path = Path(path)
    if flag != "--medusa" and path.is_file() and path.suffix.lower() in (".gguf", ".whl", ".zip"):
        return  # a GGUF source: checked by specrt.models.gguf_source when it is opened
    if not path.exists():
        raise CheckpointError(f"{flag} {path}: no such directory")
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
        raise CheckpointError(f"{flag} {path} is not a checkpoint directory ({' and '.join(missing)} missing); "
                              f"{CHECKPOINT_NEEDS}")
