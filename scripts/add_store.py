"""A thin wrapper of `specrt store` for scripts/store_replay.py: the same datastore written to an .npz instead of
into the bundle (the replay measures a datastore without changing the bundle).

    python scripts/add_store.py BUNDLE SOURCE --npz OUT.npz [--exclude QUESTIONS.jsonl]
    python scripts/add_store.py BUNDLE SOURCE [--exclude QUESTIONS.jsonl]   # = specrt store BUNDLE --from SOURCE

SOURCE and --exclude as `specrt store --from` reads them (runtime/proposers/store_sources.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("source", type=Path)
    ap.add_argument("--exclude", type=Path)
    ap.add_argument("--npz", type=Path)
    a = ap.parse_args()
    if a.npz is None:
        from specrt.cli import main as cli

        cli(["store", str(a.bundle), "--from", str(a.source)] + (["--exclude", str(a.exclude)] if a.exclude else []))
        return
    from specrt.runtime import load
    from specrt.runtime.proposers.store_sources import build_store, read_source

    gen = load(a.bundle, backend="ort", threads=1, warmup=False)
    seqs, note = read_source(gen, a.source, a.exclude)
    store = build_store(gen, seqs, str(a.source))
    np.savez(a.npz, corpus=store.corpus, order=store.order)
    print(f"datastore of {note}: {int((store.corpus >= 0).sum())} tokens, written to {a.npz}", file=sys.stderr)


if __name__ == "__main__":
    main()
