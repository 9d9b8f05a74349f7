"""The one manifest writer. `compile` collects the typed entries in a `ManifestDraft` while its steps run
(export, quantization, Medusa heads, TensorRT engines, the demo mark), then `write_manifest` checksums every
file, builds the validated `Manifest` and writes manifest.json.

The compiler writes into a temporary directory that it renames into place only after the manifest is
written (compiler/output_dir.py): a bundle is never seen half-written.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

from specrt.bundle.entries import ModelEntry
from specrt.bundle.manifest import MANIFEST, file_entries
from specrt.bundle.parts import DemoEntry, DraftHeadEntry, EngineEntry, FileEntry, MedusaEntry, TokenizerEntry
from specrt.bundle.schema import Manifest


@dataclasses.dataclass
class ManifestDraft:
    """The manifest of a bundle being compiled: compile steps set or replace its typed entries (each one
    validated when it is built); `write_manifest` adds the file list and validates the whole."""

    max_seq_len: int
    max_draft_tokens: int
    torch_version: str | None = None
    onnx: dict[str, Any] | None = None  # {"opset", "ir_version"}
    created: str = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    batch_size: int = 1
    models: dict[str, ModelEntry] = dataclasses.field(default_factory=dict)
    engines: dict[str, EngineEntry] = dataclasses.field(default_factory=dict)
    tokenizer: TokenizerEntry | None = None
    medusa: MedusaEntry | None = None
    demo: DemoEntry | None = None
    draft_head: DraftHeadEntry | None = None

    @classmethod
    def of(cls, m: Manifest) -> "ManifestDraft":
        """A draft holding every entry of the written manifest `m` (to add or replace entries of a bundle)."""
        return cls(m.max_seq_len, m.max_draft_tokens, torch_version=m.torch_version, onnx=m.onnx, created=m.created,
                   batch_size=m.batch_size or 1, models=dict(m.models), engines=dict(m.engines),
                   tokenizer=m.tokenizer, medusa=m.medusa, demo=m.demo, draft_head=m.draft_head)

    def manifest(self, files: dict[str, FileEntry], root: Path | None = None) -> Manifest:
        """The validated Manifest of this draft with the file list `files`."""
        if self.tokenizer is None:
            raise ValueError("the manifest draft has no tokenizer entry yet")
        return Manifest(max_seq_len=self.max_seq_len, max_draft_tokens=self.max_draft_tokens,
                        models=dict(self.models), tokenizer=self.tokenizer, files=files,
                        created=self.created, torch_version=self.torch_version, onnx=self.onnx,
                        batch_size=self.batch_size, engines=dict(self.engines), medusa=self.medusa,
                        draft_head=self.draft_head, demo=self.demo, root=root)


def write_manifest(root: Path, draft: ManifestDraft) -> Manifest:
    """Checksum every file under `root`, validate the manifest, write `root`/manifest.json; returns it."""
    files = {rel: FileEntry(meta["sha256"], meta["size"], f"files[{rel!r}]")
             for rel, meta in file_entries(root).items()}
    manifest = draft.manifest(files, root)
    (root / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
    return manifest
