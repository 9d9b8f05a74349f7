"""The fused head's training loss (training-time test over several draft depths) and its held-out measure.

Depth 0's rows read the target's features (final + three layers); depth j > 0's row r reads depth j - 1's own
output feature at row r - 1 and no layer features, with the attention of a drafting head (ttt_layer): so depth j
trains exactly the (j + 1)-th draft of a chain, conditioned on the drafts before it being accepted (their tokens
are the true ones). Each depth's loss is the cross-entropy against the target's distribution of the token it
guesses (its top-K logits restricted to the head's vocabulary and renormalised: the KL on the top-K up to a
constant), plus `feature_weight` x a smooth-L1 pull of the output feature towards the target's next feature;
depth j weighs `depth_decay ** j`.

The same pass measures greedy acceptance exactly: on the target's greedy answer, the chain anchored at row a
drafts token a + 2 + j at depth j's row a + j, so P(drafts 1..i accepted) is the mean over anchors of the product
of depth j's row a + j being right for j < i. `drafting_acceptance` checks it against real drafting (its own
KV cache, one row at a time) in the tests.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from specrt.models.draft_head_fused import FusedDraftHead, ttt_layer


def depth_passes(head: FusedDraftHead, w: dict, depths: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(logits [B,R,V'], hidden [B,R,D])] for depths 0..depths-1 over the windows `w` (recipes/head_shardset.py)."""
    keys: list = []
    values: list = []
    g, z, out = w["final"], w["layers"], []
    for j in range(depths):
        x = head.fc_input(g, w["ids"], w["pos"], z if j == 0 else None)
        logits, hidden = head.head_out(ttt_layer(head, x, w["pos"], keys, values, j))
        out.append((logits, hidden))
        g, z = torch.cat((w["final"][:, :1], hidden[:, :-1]), dim=1), None
    return out


def ttt_loss(head: FusedDraftHead, w: dict, depths: int = 3, feature_weight: float = 1.0,
             depth_decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """(loss, top-1 agreement with the target's argmax per depth) of one batch of windows."""
    kept = w["tgt_top"] >= 0
    p = torch.softmax(w["tgt_logits"].masked_fill(~kept, float("-inf")), dim=-1).nan_to_num(0.0)  # [B, R, K]
    rows = torch.arange(w["ids"].shape[1])
    total, weights, agree = 0.0, 0.0, []
    for j, (logits, hidden) in enumerate(depth_passes(head, w, depths)):
        valid = (w["mask"] & (rows >= j)[None, :]).float()
        ce = -(p * F.log_softmax(logits, dim=-1).gather(-1, w["tgt_top"].clamp(min=0))).sum(-1)  # [B, R]
        feat = F.smooth_l1_loss(hidden, w["tgt_final"], reduction="none").mean(-1)
        loss = ((ce + feature_weight * feat) * valid).sum() / valid.sum().clamp(min=1)
        total, weights = total + depth_decay ** j * loss, weights + depth_decay ** j
        right = (logits.argmax(-1) == w["tgt_top"][..., 0]).float()
        agree.append(float((right * valid).sum() / valid.sum().clamp(min=1)))
    return total / weights, agree


@torch.no_grad()
def heldout_acceptance(head: FusedDraftHead, seqs: list[dict], k: int = 3) -> dict:
    """Greedy acceptance of k-token chains at every answer position of the held-out greedy answers (see above):
    {"positions", "per_position": P(drafts 1..i accepted), "conditional": P(draft i | drafts < i accepted),
    "tf_top1": depth-0 agreement with the target's greedy token (the head fed the target's true features),
    "acceptance": mean accepted / k}."""
    acc, tf_right, tf_total, anchors = np.zeros(k), 0, 0, 0
    for s in seqs:
        ids, t_len, p_len = s["ids"], s["ids"].numel(), s["prompt_len"]
        rows = t_len - 1
        f = s["feats"].float()
        w = {"final": f[None, :rows, -1], "layers": f[None, :rows, :-1], "ids": ids[None, 1:],
             "pos": torch.arange(rows)[None]}
        right = []  # right[j][r]: depth j's row r guesses token r + 2
        truth = ids[2:]
        for logits, _ in depth_passes(head, w, k):
            guess = head.vocab_ids[logits[0, :rows - 1].argmax(-1)]
            right.append((guess == truth).numpy())
        lo = max(p_len - 1, 0)  # the first proposal: anchor row p_len - 1 drafts token p_len + 1 (p_len: prefill)
        tf_right += int(right[0][lo:].sum())
        tf_total += max(rows - 1 - lo, 0)
        for a in range(lo, rows - 1 - (k - 1)):
            ok = True
            for j in range(k):
                ok = ok and bool(right[j][a + j])
                acc[j] += ok
            anchors += 1
    per = acc / max(anchors, 1)
    cond = [per[0]] + [per[i] / per[i - 1] if per[i - 1] else 0.0 for i in range(1, k)]
    return {"positions": anchors, "k": k, "per_position": [round(float(x), 4) for x in per],
            "conditional": [round(float(x), 4) for x in cond], "tf_top1": round(tf_right / max(tf_total, 1), 4),
            "acceptance": round(float(per.sum()) / k, 4)}


@torch.no_grad()
def drafting_acceptance(head: FusedDraftHead, seq: dict, k: int = 3) -> list[int]:
    """Real drafting on one greedy sequence: per anchor row a, the head runs rows 0..a on the target's features,
    then drafts with its own KV cache one row at a time. Returns accepted counts per draft position."""
    c = head.config
    ids, f = seq["ids"], seq["feats"].float()
    rows = ids.numel() - 1
    empty = torch.zeros(1, 0, c.num_kv_heads, c.head_dim)
    logits, hidden, keys, values = head(f[None, :rows, -1], ids[None, 1:], torch.arange(rows)[None], empty, empty,
                                        f[None, :rows, :-1])
    acc = [0] * k
    for a in range(max(seq["prompt_len"] - 1, 0), rows - 1 - (k - 1)):
        d = int(head.vocab_ids[int(logits[0, a].argmax())])
        h, kp, vp = hidden[:, a:a + 1], keys[:, :a + 1], values[:, :a + 1]
        for i in range(k):
            if d != int(ids[a + 2 + i]):
                break
            acc[i] += 1
            if i + 1 == k:
                break
            lg, h, kn, vn = head(h, torch.tensor([[d]]), torch.tensor([[a + 1 + i]]), kp, vp)
            kp, vp = torch.cat((kp, kn), 1), torch.cat((vp, vn), 1)
            d = int(head.vocab_ids[int(lg[0, 0].argmax())])
    return acc
