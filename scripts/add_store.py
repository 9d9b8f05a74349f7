"""Add (or replace) a datastore of the target's own answers in a bundle (`auto`'s source `store`,
runtime/proposers/store.py), or write one to an .npz for scripts/store_replay.py.

    python scripts/add_store.py BUNDLE SOURCE [--exclude QUESTIONS.jsonl] [--npz OUT.npz]

SOURCE: a directory of answer shards (shard-NNNNN/ with ids.npy, starts.npy and meta.json holding each sample's
prompt_len: the answers are the tokens past each prompt; shards whose meta.json is under 2 minutes old are still
being written and are skipped), or an .npz with `corpus` and `order` (a datastore written by --npz).
--exclude: drop the samples whose prompt holds the start (40 characters) of a question of that file, so a datastore
measured on those questions never holds their answers. --npz: write the datastore there instead of into BUNDLE.
The bundle's manifest is rewritten with fresh checksums (as scripts/add_draft_head.py does).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from pathlib import Path

import numpy as np

from specrt.runtime.proposers.store import Datastore, add_to_bundle


def shard_answers(shards: Path, tokenizer, exclude: Path | None) -> tuple[list[np.ndarray], int]:
    """(the answers of every finished shard, how many were dropped by `exclude`)."""
    heads = [json.loads(line)["turns"][0][:40] for line in open(exclude)] if exclude else []
    seqs, dropped = [], 0
    for d in sorted(glob.glob(os.path.join(shards, "shard-*"))):
        meta = os.path.join(d, "meta.json")
        if not os.path.exists(meta) or time.time() - os.path.getmtime(meta) < 120:
            continue
        ids, starts, rows = np.load(f"{d}/ids.npy"), np.load(f"{d}/starts.npy"), json.load(open(meta))
        for i, m in enumerate(rows):
            if heads and any(h in tokenizer.decode(ids[starts[i]:starts[i] + m["prompt_len"]].tolist()) for h in heads):
                dropped += 1
                continue
            seqs.append(ids[starts[i] + m["prompt_len"]:starts[i + 1]])
    return seqs, dropped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("source", type=Path)
    ap.add_argument("--exclude", type=Path)
    ap.add_argument("--npz", type=Path)
    a = ap.parse_args()
    if a.source.suffix == ".npz":
        z = np.load(a.source, allow_pickle=False)
        store, note = Datastore(z["corpus"], z["order"]), ""
    else:
        from specrt.runtime import load

        tok = load(a.bundle, backend="ort", threads=1, warmup=False).tokenizer
        seqs, dropped = shard_answers(a.source, tok, a.exclude)
        store, note = Datastore.from_sequences(seqs), f" from {len(seqs)} answers ({dropped} excluded)"
    if a.npz:
        np.savez(a.npz, corpus=store.corpus, order=store.order)
    else:
        add_to_bundle(a.bundle, store)
    print(f"datastore{note}: {int((store.corpus >= 0).sum())} tokens, {store.nbytes / 2**20:.1f} MiB in memory, "
          f"written to {a.npz or a.bundle}")


if __name__ == "__main__":
    main()
