"""Add (or replace) a draft head in an existing bundle, for benchmarks: `specrt compile --draft head:DIR` re-exports
the whole target, which takes minutes on a loaded 2-core machine; this runs only the draft-head step.

    python scripts/add_draft_head.py BUNDLE HEAD_DIR TARGET_CHECKPOINT_DIR [--precision target|fp32|int8|int4]

TARGET_CHECKPOINT_DIR is the target as a checkpoint directory (a GGUF target: the one `specrt train-head`
converted into its run directory, RUN/target/checkpoint). `--precision target` (the default) quantizes the head
as `compile` would: int8 when the bundle's target is quantized (its block size and symmetry), else fp32. The manifest is
rewritten with fresh checksums; keys this specrt does not know are dropped.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from specrt.bundle.manifest import read_manifest
from specrt.bundle.writer import ManifestDraft, write_manifest
from specrt.compiler.draft_head import draft_head_step
from specrt.compiler.quantize import DEFAULT_BLOCK_SIZE, QuantizeConfig
from specrt.compiler.quantize_prepare import head_quantization


def head_quantize(manifest, precision: str) -> QuantizeConfig | None:
    """The head's QuantizeConfig for `precision`: "target" is what `compile` gives (head_quantization: int8 when the
    target is quantized, else fp32), "fp32" None, "int8" / "int4" that type; the target's block size and symmetry."""
    if precision == "fp32":
        return None
    q = manifest.models["target"].quantization
    return head_quantization({
        "quantize": q.type if q else None, "draft_quantize": None if precision == "target" else precision,
        "quant_block_size": q.block_size if q else DEFAULT_BLOCK_SIZE, "quant_symmetric": q.symmetric if q else True,
        "quant_accuracy_level": None, "quant_batch_invariant": True})


def add_head(bundle: Path, head_dir: Path, target_dir: Path, precision: str = "target") -> None:
    m = read_manifest(bundle)
    draft = ManifestDraft.of(m)
    draft.draft_head = None  # replaced by the step below
    shutil.rmtree(bundle / "draft_head", ignore_errors=True)
    draft_head_step(head_dir, target_dir, head_quantize(m, precision))(bundle, draft)
    write_manifest(bundle, draft)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("head_dir", type=Path)
    parser.add_argument("target_dir", type=Path)
    parser.add_argument("--precision", choices=("target", "fp32", "int8", "int4"), default="target")
    args = parser.parse_args()
    add_head(args.bundle, args.head_dir, args.target_dir, args.precision)
    print(f"added {args.head_dir} to {args.bundle} ({args.precision})")
