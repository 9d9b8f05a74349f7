"""Add (or replace) a draft head in an existing bundle, for benchmarks: `specrt compile --draft head:DIR` re-exports
the whole target, which takes minutes on a loaded 2-core machine; this runs only the draft-head step.

    python scripts/add_draft_head.py BUNDLE HEAD_DIR TARGET_CHECKPOINT_DIR

TARGET_CHECKPOINT_DIR is the target as a checkpoint directory (a GGUF target: the one `specrt train-head`
converted into its run directory, RUN/target/checkpoint). The manifest is rewritten with fresh checksums;
keys this specrt does not know are dropped.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from specrt.bundle.manifest import read_manifest
from specrt.bundle.writer import ManifestDraft, write_manifest
from specrt.compiler.draft_head import draft_head_step


def add_head(bundle: Path, head_dir: Path, target_dir: Path) -> None:
    m = read_manifest(bundle)
    draft = ManifestDraft(m.max_seq_len, m.max_draft_tokens, torch_version=m.torch_version, onnx=m.onnx,
                          created=m.created, batch_size=m.batch_size or 1, models=dict(m.models),
                          engines=dict(m.engines), tokenizer=m.tokenizer, medusa=m.medusa, demo=m.demo)
    shutil.rmtree(bundle / "draft_head", ignore_errors=True)
    draft_head_step(head_dir, target_dir)(bundle, draft)
    write_manifest(bundle, draft)


if __name__ == "__main__":
    add_head(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
    print(f"added {sys.argv[2]} to {sys.argv[1]}")
