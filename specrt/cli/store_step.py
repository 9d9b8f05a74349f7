"""`specrt compile --store SOURCE`'s step: the datastore of `auto`'s source `store` (runtime/proposers/store.py) read
from SOURCE as `specrt store --from` reads it (runtime/proposers/store_sources.py), or with `--store builtin` the
new bundle's own greedy answers to the prompts shipped with specrt (as `specrt store --answers builtin
--max-new-tokens 256`), written as store/*.npy into the temporary bundle before its manifest, so the files are
listed and hashed like every other. A missing SOURCE fails before anything is compiled; bad content fails the
compile and no bundle is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from specrt.core.errors import InvalidArgument

BUILTIN_ANSWER_TOKENS = 256  # per answer (SmolLM2-135M: 519 answers, ~99k tokens, ~12 minutes on 2 cores)


def store_step(source: Path) -> Callable:
    """A compile step (tmp, manifest draft) -> None writing tmp/store/corpus.npy and order.npy."""
    from specrt.runtime.proposers.store_sources import is_builtin

    builtin = is_builtin(source)
    if not builtin and not Path(source).exists():
        raise InvalidArgument(f"--store {source}: no such file or directory")

    def step(tmp: Path, draft) -> None:
        from specrt.bundle.manifest import file_entries
        from specrt.bundle.parts import FileEntry
        from specrt.runtime.generator import Generator
        from specrt.runtime.proposers.store_sources import answer_prompts, build_store, builtin_prompts, read_source
        from specrt.runtime.proposers.store_write import write_store

        files = {rel: FileEntry(meta["sha256"], meta["size"], f"files[{rel!r}]")
                 for rel, meta in file_entries(tmp).items()}
        gen = Generator(draft.manifest(files, tmp), backend="ort", warmup=False)
        try:
            if builtin:
                seqs, _ = answer_prompts(gen, builtin_prompts(), BUILTIN_ANSWER_TOKENS, skip_long=True)
            else:
                seqs, _ = read_source(gen, Path(source))
            store = build_store(gen, seqs, f"--store {source}")
        finally:
            del gen
        write_store(store, tmp)

    return step
