"""`specrt compile`'s last step: the successor table of Token Recycling (`--method recycle`), seeded from the
compiled target's own greedy answers (runtime/proposers/recycle_seed.py) and written as recycle/table.npy
before the manifest, so the file is listed with its sha256 like every other bundle file.

The step runs the graphs just written (ONNX Runtime on the CPU) through a Generator opened on the temporary
directory, from a manifest built in memory; it lives on the command line's side because the compiler does not
import the runtime (tests/test_layering.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def recycle_seed_step(prompts_file: Path | None = None) -> Callable:
    """A compile step (tmp, manifest draft) -> None writing tmp/recycle/table.npy. A bad prompts file fails
    here, before anything is compiled."""
    from specrt.runtime.proposers.recycle_seed import read_prompts

    prompts = read_prompts(prompts_file) if prompts_file is not None else None

    def step(tmp: Path, draft) -> None:
        from specrt.bundle.manifest import file_entries
        from specrt.bundle.parts import FileEntry
        from specrt.runtime.generator import Generator
        from specrt.runtime.proposers.recycle_seed import seed_table, write_table

        files = {rel: FileEntry(meta["sha256"], meta["size"], f"files[{rel!r}]")
                 for rel, meta in file_entries(tmp).items()}
        gen = Generator(draft.manifest(files, tmp), backend="ort", warmup=False)
        try:
            write_table(seed_table(gen, prompts), tmp)
        finally:
            del gen

    return step
