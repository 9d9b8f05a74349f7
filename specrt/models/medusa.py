"""Medusa-1 heads (Cai et al. 2024) on a frozen target, as exported into bundles.

On-disk format (written by `specrt train-medusa` / recipes/medusa.py, read by `specrt compile --medusa`):
a directory with `medusa_config.json` = {"medusa_num_heads": H, "medusa_num_layers": 1, "hidden_size": D,
"vocab_size": V, "shares_target_lm_head": true} and `medusa.safetensors` with `heads.{i}.weight` [D, D]
and `heads.{i}.bias` [D]. Head i: logits_i = lm_head(h + silu(W_i h + b_i)); h is the target's final
hidden state (after the final norm) at position t, and head i predicts the token at t + i + 2.
"""

from __future__ import annotations

import torch
from torch import nn


class MedusaHeadsWithLMHead(nn.Module):
    def __init__(self, num_heads: int, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: [N, D] -> logits [N, H, V]
        h = hidden_states
        return torch.stack([self.lm_head(h + nn.functional.silu(head(h))) for head in self.heads], dim=1).float()
