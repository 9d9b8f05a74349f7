"""Reading the shards of recipes/head_shards.py: sequences (memory-mapped), training windows, the vocabulary.

`ShardSet(dir)` lists every whole shard (re-scan with `refresh()` while the data is still being made) and splits
its sequences into training ones and held-out ones (base prompts `heldout`, greedy only). A training window is at
most `rows` head rows of one sequence; head row t reads the target's features at t and token t + 1 and is trained
towards the target's distribution of token t + 2 (its top-K logits at row t + 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from specrt.recipes.head_shards import heldout


class ShardSet:
    def __init__(self, shard_dir: Path) -> None:
        self.dir = Path(shard_dir)
        self.shards: dict[str, dict] = {}
        self.train: list[tuple[str, int]] = []  # (shard name, sequence index)
        self.heldout: list[tuple[str, int]] = []
        self.refresh()

    def refresh(self) -> int:
        """Open the shards made since the last call; returns how many are open."""
        for path in sorted(self.dir.glob("shard-?????")):
            if path.name in self.shards or not path.is_dir():
                continue
            shard = {name: np.load(path / f"{name}.npy", mmap_mode="r")
                     for name in ("ids", "starts", "feats", "top_ids", "top_logits")}
            shard["meta"] = json.loads((path / "meta.json").read_text())
            self.shards[path.name] = shard
            for i, m in enumerate(shard["meta"]):
                if heldout(m["base"]):
                    if m["greedy"] and m["style"] == 0:
                        self.heldout.append((path.name, i))
                elif shard["starts"][i + 1] - shard["starts"][i] >= 3:
                    self.train.append((path.name, i))
        return len(self.shards)

    def sequence(self, ref: tuple[str, int]) -> dict:
        """{ids [T], feats [T, F, D] fp16, top_ids [T, K], top_logits [T, K], prompt_len, greedy} (torch, copied)."""
        s = self.shards[ref[0]]
        a, b = int(s["starts"][ref[1]]), int(s["starts"][ref[1] + 1])
        m = s["meta"][ref[1]]
        return {"ids": torch.from_numpy(s["ids"][a:b].astype(np.int64)),
                "feats": torch.from_numpy(np.array(s["feats"][a:b])),
                "top_ids": torch.from_numpy(np.array(s["top_ids"][a:b])),
                "top_logits": torch.from_numpy(np.array(s["top_logits"][a:b])),
                "prompt_len": m["prompt_len"], "greedy": m["greedy"], "prompt": m["base"]}

    def tokens(self, refs: list[tuple[str, int]]) -> int:
        return int(sum(self.shards[n]["starts"][i + 1] - self.shards[n]["starts"][i] for n, i in refs))

    def token_counts(self, vocab_size: int) -> np.ndarray:
        """[V] how often each token occurs in the training sequences."""
        counts = np.zeros(vocab_size, dtype=np.int64)
        for name, i in self.train:
            s = self.shards[name]
            np.add.at(counts, s["ids"][s["starts"][i]:s["starts"][i + 1]], 1)
        return counts


def choose_vocab_from_counts(counts: np.ndarray, size: int, always: set[int]) -> torch.Tensor:
    """The `size` most frequent tokens (plus `always`, e.g. EOS), most frequent first."""
    keep = [int(t) for t in sorted(always) if 0 <= t < counts.size]
    seen = set(keep)
    for t in np.argsort(-counts, kind="stable"):
        if len(keep) >= min(size, counts.size):
            break
        if int(t) not in seen:
            keep.append(int(t))
            seen.add(int(t))
    return torch.tensor(keep, dtype=torch.long)


def make_windows(seqs: list[dict], rows: int, rng: np.random.Generator, lookup: torch.Tensor) -> dict:
    """A batch of windows (right-padded, `mask` False on padding):
    final [B,R,D], layers [B,R,F-1,D], ids [B,R] (token t+1), pos [B,R], tgt_final [B,R,D] (f_{t+1}),
    tgt_top [B,R,K] (reduced ids of token t+2's top-K, -1 = outside V'), tgt_logits [B,R,K], mask [B,R] (False on
    padding and on rows guessing a prompt token)."""
    parts = []
    for s in seqs:
        t = s["ids"].numel()
        n = min(rows, t - 1)  # head rows [start, start + n) <= t - 2: token t + 1 and row t + 1's distribution exist
        start = int(rng.integers(0, t - 1 - n + 1))
        r, nxt = slice(start, start + n), slice(start + 1, start + 1 + n)
        f = s["feats"].float()
        # the loss counts the rows whose guessed token (t + 2) is in the answer: the prompt's rows are context only
        # (a head never drafts inside a prompt, and the chat template's fixed system text would inflate the loss)
        answer = torch.arange(start, start + n) >= s["prompt_len"] - 2
        parts.append({"answer": answer, "final": f[r, -1], "layers": f[r, :-1], "ids": s["ids"][nxt], "pos": torch.arange(start, start + n),
                      "tgt_final": f[nxt, -1], "tgt_top": lookup[s["top_ids"][nxt].long()],
                      "tgt_logits": s["top_logits"][nxt].float()})
    width = max(p["ids"].numel() for p in parts)
    out = {}
    for key in parts[0]:
        out[key] = torch.stack([torch.cat((p[key], p[key][-1:].expand(width - p[key].shape[0], *p[key].shape[1:])))
                                for p in parts])
    out["mask"] = torch.stack([torch.arange(width) < p["ids"].numel() for p in parts]) & out.pop("answer")
    return out
