"""Medusa-1 heads on a frozen target.

Format (read by the specrt compiler): a directory with

* ``medusa_config.json``: ``{"medusa_num_heads": H, "medusa_num_layers": 1,
  "hidden_size": D, "vocab_size": V, "shares_target_lm_head": true}``
* ``medusa.safetensors``: ``heads.{i}.weight`` [D, D] and ``heads.{i}.bias`` [D].

Head i computes ``logits_i = lm_head(h + silu(h @ W_i.T + b_i))`` where ``h`` is
the target's final hidden state after its final norm (the input of ``lm_head``)
and ``lm_head`` is the target's own, frozen and shared.  Head i at position t
predicts the token at t + i + 2 (head 0 = the token after next).  Heads start at
zero (each head equals the base LM head).

Training loss (self-distillation): KL(p_target || p_head_i), where p_target is the
target's own next-token distribution at position t + i + 1, i.e. its prediction
of the same token t + i + 2.  This matches what is needed for speculative
decoding (agree with the target) and needs no extra forward pass.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specrt.recipes.common import autocast, sample_batch, set_seed, train_loop


class MedusaHeads(torch.nn.Module):
    """H residual SiLU blocks ``h + silu(W h + b)``; the LM head is supplied by the target."""

    def __init__(self, num_heads: int, hidden_size: int):
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        for lin in self.heads:
            torch.nn.init.zeros_(lin.weight)
            torch.nn.init.zeros_(lin.bias)

    def forward(self, h: torch.Tensor) -> list[torch.Tensor]:
        return [h + F.silu(lin(h)) for lin in self.heads]


def _final_norm(model):
    """The final norm module of common HF decoder layouts (None if not found)."""
    base = getattr(model, model.base_model_prefix, None)
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        if base is not None and hasattr(base, name):
            return getattr(base, name)
    return None


def final_hidden(model, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (h, logits) where ``h`` is exactly the input of ``lm_head``.

    Uses ``output_hidden_states``; if ``lm_head(hidden_states[-1])`` does not
    reproduce the logits, the model's final norm is applied (checked once per model).
    """
    out = model(input_ids=input_ids, output_hidden_states=True)
    h = out.hidden_states[-1]
    flag = getattr(model, "_specrt_apply_norm", None)
    if flag is None:
        lm = model.get_output_embeddings()
        with torch.no_grad():
            ref = out.logits[:1, :8].float()
            direct = lm(h[:1, :8]).float()
            flag = not torch.allclose(direct, ref, atol=1e-2 * (1 + ref.abs().max().item()))
            if flag:
                normed = lm(_final_norm(model)(h[:1, :8])).float()
                assert torch.allclose(normed, ref, atol=1e-2 * (1 + ref.abs().max().item())), \
                    "cannot reconstruct the lm_head input of this model"
        model._specrt_apply_norm = flag
    if flag:
        h = _final_norm(model)(h)
    return h, out.logits


def head_logits(model, heads: MedusaHeads, h: torch.Tensor) -> list[torch.Tensor]:
    """Logits of every head from final hidden states ``h`` via the target's lm_head."""
    lm = model.get_output_embeddings()
    return [lm(z) for z in heads(h.to(heads.heads[0].weight.dtype))]


def save_medusa(heads: MedusaHeads, out_dir: str | Path, vocab_size: int,
                dtype: torch.dtype = torch.float16) -> None:
    """Write ``medusa_config.json`` and ``medusa.safetensors`` (see module docstring)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    d = heads.heads[0].weight.shape[0]
    cfg = {"medusa_num_heads": len(heads.heads), "medusa_num_layers": 1, "hidden_size": d,
           "vocab_size": int(vocab_size), "shares_target_lm_head": True}
    (out / "medusa_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = {f"heads.{i}.{k}": getattr(lin, k).detach().to("cpu", dtype).contiguous()
               for i, lin in enumerate(heads.heads) for k in ("weight", "bias")}
    save_file(tensors, str(out / "medusa.safetensors"), metadata={"format": "pt"})


def load_medusa(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[MedusaHeads, dict]:
    """Load heads saved by :func:`save_medusa`; returns (heads, config)."""
    p = Path(path)
    cfg = json.loads((p / "medusa_config.json").read_text())
    heads = MedusaHeads(cfg["medusa_num_heads"], cfg["hidden_size"])
    state = {k: v.to(dtype) for k, v in load_file(str(p / "medusa.safetensors")).items()}
    heads.load_state_dict(state)
    return heads.to(dtype), cfg


def train_medusa(target, tokens: np.ndarray, run_dir: str | Path, *, num_heads: int = 3,
                 steps: int | None = None, max_minutes: float | None = 8.0, seq_len: int = 512,
                 batch_size: int = 8, lr: float = 1e-3, seed: int = 0, progress: bool = True):
    """Train Medusa heads on a frozen ``target``; resumable via ``run_dir/ckpt.pt``.

    Returns (heads, training stats).
    """
    run = Path(run_dir)
    set_seed(seed)
    dev = next(target.parameters()).device
    target.eval().requires_grad_(False)
    heads = MedusaHeads(num_heads, target.config.hidden_size).to(dev)
    n = num_heads

    def loss_fn(step: int) -> torch.Tensor:
        x = sample_batch(tokens, batch_size, seq_len, step, seed + 1, dev)
        with torch.no_grad(), autocast(dev):
            h, logits = final_hidden(target, x)
        h = h.float().detach()
        logp_t = F.log_softmax(logits.float(), -1)
        total = 0.0
        with autocast(dev):
            outs = head_logits(target, heads, h)
        for i, lg in enumerate(outs):
            # head i at t vs the target's distribution at t+i+1 (both predict t+i+2)
            span = seq_len - i - 1
            lq = F.log_softmax(lg[:, :span].float(), -1)
            total = total + F.kl_div(lq.reshape(-1, lq.shape[-1]),
                                     logp_t[:, i + 1:].reshape(-1, lq.shape[-1]),
                                     log_target=True, reduction="batchmean")
        return total / n

    stats = train_loop(heads, list(heads.parameters()), loss_fn, ckpt_path=run / "ckpt.pt",
                       steps=steps, tokens_per_step=batch_size * seq_len, lr=lr, warmup=20,
                       weight_decay=0.0, max_minutes=max_minutes, progress=progress, desc="medusa")
    return heads, stats
