"""Train a draft head (specrt/models/draft_head.py) on cached target features; measure its acceptance.

Loss per head row t (input f_t and token t+1): cross-entropy between the head's distribution over its V' tokens
and the target's distribution of token t+2 (its top-K logits at position t+1, restricted to V', renormalised),
plus a smooth-L1 pull of the head's output feature towards the target's f_{t+1}. A second pass ("training-time
test", as in EAGLE-3, simplified) replaces half the input features at random by the head's own outputs of the
first pass (shifted one row), so the head learns to draft on its own features as it does at run time.
Only `fc` and `layer` train (`DraftHead.trained_parameters`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specrt.models.draft_head import DraftHead
from specrt.recipes.common import train_loop

FEATURE_LOSS_WEIGHT = 1.0


def choose_vocab(seqs: list[dict], vocab_size: int, size: int, always: set[int]) -> torch.Tensor:
    """The `size` most frequent tokens of the training sequences (plus `always`, e.g. EOS), most frequent first."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for s in seqs:
        np.add.at(counts, s["ids"].numpy(), 1)
    order = np.argsort(-counts, kind="stable")
    keep = [int(t) for t in always if 0 <= t < vocab_size]
    for t in order:
        if len(keep) >= min(size, vocab_size):
            break
        if int(t) not in keep:
            keep.append(int(t))
    return torch.tensor(keep, dtype=torch.long)


def reduced_index(vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] full id -> index in the head's vocabulary, or -1."""
    lookup = torch.full((vocab_size,), -1, dtype=torch.long)
    lookup[vocab_ids] = torch.arange(vocab_ids.numel())
    return lookup


def make_batch(seqs: list[dict], picks: list[int], max_rows: int, rng: np.random.Generator, lookup: torch.Tensor):
    """Windows of at most `max_rows` head rows from the sequences `picks`, right-padded (masked).

    Returns feats [B,R,D], ids [B,R], pos [B,R], target features [B,R,D], target top ids (reduced, -1 = not
    kept) [B,R,K], target top logits [B,R,K], mask [B,R].
    """
    rows = []
    for i in picks:
        s = seqs[i]
        t = s["ids"].numel()
        n = min(max_rows, t - 1)  # head rows 0 .. t-2
        start = int(rng.integers(0, t - 1 - n + 1))
        r = slice(start, start + n)
        nxt = slice(start + 1, start + 1 + n)
        rows.append((s["features"][r].float(), s["ids"][nxt], torch.arange(start, start + n),
                     s["features"][nxt].float(), lookup[s["top_ids"][nxt].long()], s["top_logits"][nxt].float()))
    width = max(x[0].shape[0] for x in rows)
    out = []
    for j in range(6):
        padded = []
        for x in rows:
            a = x[j]
            pad = width - a.shape[0]
            padded.append(torch.cat((a, a[-1:].expand(pad, *a.shape[1:]))) if pad else a)
        out.append(torch.stack(padded))
    mask = torch.stack([torch.arange(width) < x[0].shape[0] for x in rows])
    return (*out, mask)


def row_losses(head: DraftHead, feats, ids, pos, tgt_feats, tgt_top, tgt_logits, mask):
    """(loss, head output features) of one pass over a batch (rows where mask is False are ignored)."""
    c = head.config
    b = feats.shape[0]
    empty = torch.zeros(b, 0, c.num_kv_heads, c.head_dim)
    logits, hidden, _, _ = head(feats, ids, pos, empty, empty)
    logq = F.log_softmax(logits, dim=-1)  # [B, R, V']
    kept = tgt_top >= 0
    p = torch.softmax(tgt_logits.masked_fill(~kept, float("-inf")), dim=-1).nan_to_num(0.0)  # [B, R, K]
    ce = -(p * logq.gather(-1, tgt_top.clamp(min=0))).sum(-1)  # [B, R]
    feat = F.smooth_l1_loss(hidden, tgt_feats, reduction="none").mean(-1)
    m = mask.float()
    loss = ((ce + FEATURE_LOSS_WEIGHT * feat) * m).sum() / m.sum().clamp(min=1)
    return loss, hidden


def train_head(head: DraftHead, seqs: list[dict], run_dir: Path, *, steps: int | None, max_minutes: float | None,
               batch_size: int = 8, max_rows: int = 256, lr: float = 1e-3, seed: int = 0,
               progress: bool = True) -> dict:
    """AdamW on fc + layer, resumable from `run_dir`/ckpt.pt (recipes/common.train_loop)."""
    lookup = reduced_index(head.vocab_ids, head.config.vocab_size)
    usable = [i for i, s in enumerate(seqs) if s["ids"].numel() >= 3]
    if not usable:
        raise ValueError("no training sequence has 3 tokens or more")

    def loss_fn(step: int) -> torch.Tensor:
        rng = np.random.default_rng([seed, step])
        picks = [usable[int(i)] for i in rng.integers(0, len(usable), size=batch_size)]
        feats, ids, pos, tf, tt, tl, mask = make_batch(seqs, picks, max_rows, rng, lookup)
        loss1, hidden = row_losses(head, feats, ids, pos, tf, tt, tl, mask)
        # training-time test: rows read the head's own guess of their feature (row t-1's output) half the time
        own = torch.cat((feats[:, :1], hidden[:, :-1]), dim=1)
        swap = torch.from_numpy(rng.random(feats.shape[:2]) < 0.5)[..., None]
        loss2, _ = row_losses(head, torch.where(swap, own, feats), ids, pos, tf, tt, tl, mask)
        return loss1 + loss2

    params = head.trained_parameters()
    return train_loop(head, params, loss_fn, ckpt_path=Path(run_dir) / "ckpt.pt", steps=steps,
                      tokens_per_step=batch_size * max_rows, lr=lr, warmup=10, weight_decay=0.0,
                      max_minutes=max_minutes, ckpt_minutes=2.0, progress=progress, desc="train-head",
                      calibrate_steps=2)


@torch.no_grad()
def acceptance_per_position(head: DraftHead, seqs: list[dict], k: int = 3, max_positions: int = 4000,
                            deadline: float | None = None) -> dict:
    """Greedy acceptance of k-token head drafts on the target's greedy answers (held-out sequences).

    At each answer position the head sees the target's features of every committed position, drafts k tokens on
    its own features, and draft i counts as accepted when drafts 1..i all equal the target's greedy tokens.
    Returns {"positions": N, "per_position": [rate of draft i being accepted], "mean_accepted": mean accepted
    drafts per step, "acceptance": mean_accepted / k (the mean per drafted token when all k are drafted)}.
    Past `deadline` (time.time()) it stops after the sequence under way (`positions` says how many were measured).
    """
    c = head.config
    accepted = np.zeros(k, dtype=np.int64)
    total = 0
    for s in (s for s in seqs if s["greedy"]):
        if deadline is not None and time.time() > deadline and total:
            break
        ids, feats = s["ids"], s["features"].float()
        t_len, p_len = ids.numel(), s["prompt_len"]
        empty = torch.zeros(1, 0, c.num_kv_heads, c.head_dim)
        rows = t_len - 1
        logits, hidden, keys, values = head(feats[None, :rows], ids[None, 1:], torch.arange(rows)[None], empty,
                                            empty)
        # row t drafts tokens t+2 .. t+1+k; the first proposal is at row p_len - 1 (token p_len, the answer's first,
        # comes from the prefill: the runtime never drafts it)
        for t in range(max(p_len - 1, 0), t_len - 2):
            if total >= max_positions:
                break
            truth = ids[t + 2:t + 2 + k]
            if truth.numel() < k:
                break
            d = int(head.vocab_ids[int(logits[0, t].argmax())])
            h, kp, vp = hidden[:, t:t + 1], keys[:, :t + 1], values[:, :t + 1]
            ok = d == int(truth[0])
            accepted[0] += ok
            for i in range(1, k):
                if not ok:
                    break
                lg, h, kn, vn = head(h, torch.tensor([[d]]), torch.tensor([[t + i]]), kp, vp)
                kp, vp = torch.cat((kp, kn), 1), torch.cat((vp, vn), 1)
                d = int(head.vocab_ids[int(lg[0, 0].argmax())])
                ok = d == int(truth[i])
                accepted[i] += ok
            total += 1
    per = (accepted / max(total, 1)).tolist()
    mean = float(accepted.sum() / max(total, 1))
    return {"positions": total, "k": k, "per_position": [round(x, 4) for x in per],
            "mean_accepted": round(mean, 4), "acceptance": round(mean / k, 4)}
