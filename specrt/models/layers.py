"""Building blocks shared by every decoder family: norms, rotary embeddings, cache-split attention.

Attention never concatenates the past cache with the new keys/values: it scores the new queries against
the past block and the new block separately and joins only the scores. The graph therefore reads the
past cache (attention itself) but writes only the S new rows, which is what lets the runtime bind the
output straight into its preallocated cache (see DESIGN.md, "KV cache").
"""

from __future__ import annotations

import math

import torch
from torch import nn

from specrt.models.config import RopeConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2], with `linear`, `llama3`, `yarn` or `longrope` scaling applied (`dynamic`:
    none within max_position_embeddings, see RopeConfig.from_hf)."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if rope.rope_type == "yarn":
        inv_freq = yarn_inv_freq(rope, head_dim, inv_freq)
    elif rope.rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.rope_type == "longrope":  # the short factors (RopeConfig.short_factor)
        inv_freq = inv_freq / torch.tensor(rope.short_factor, dtype=torch.float64)
    elif rope.rope_type == "llama3":
        low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
        high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq.float()


def yarn_inv_freq(rope: RopeConfig, head_dim: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """YaRN (Peng et al.): frequencies that turn fewer than `beta_slow` times over the original length are
    interpolated (divided by `factor`), those turning more than `beta_fast` times kept, a linear ramp between."""
    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times in the original length
        return head_dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(rope.theta))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return inv_freq / rope.factor * ramp + inv_freq * (1 - ramp)  # ramp 0: the original frequency, 1: interpolated


def rope_cos_sin(rope: RopeConfig, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, times yarn's or longrope's `attention_factor` (1 for other rope types)."""
    if rope.attention_factor == 1.0:
        return freqs.cos(), freqs.sin()
    return freqs.cos() * rope.attention_factor, freqs.sin() * rope.attention_factor


class Rotary(nn.Module):
    """Rotary position embedding (the non-interleaved "rotate half" layout used by Llama/Qwen)."""

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:  # head_dim: the dimensions it turns (rotary_dim)
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)
        self.rope = rope

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # position_ids: [B, S] -> cos, sin: [B, S, 1, rotary dims]
        freqs = position_ids.float()[..., None] * self.inv_freq  # [B, S, head_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        return rope_cos_sin(self.rope, emb)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, S, H, D]; cos, sin: [.., R] with R <= D: a partial rope turns the first R dimensions, keeps the rest
    if cos.shape[-1] < x.shape[-1]:
        r = cos.shape[-1]
        return torch.cat((apply_rotary(x[..., :r], cos, sin), x[..., r:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def attend(
    q: torch.Tensor,  # [B, S, Hq, D]
    k_past: torch.Tensor,  # [B, P, Hkv, D]
    v_past: torch.Tensor,  # [B, P, Hkv, D]
    k_new: torch.Tensor,  # [B, S, Hkv, D]
    v_new: torch.Tensor,  # [B, S, Hkv, D]
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    past_lengths: torch.Tensor | None = None,  # [B] int64: valid past rows per sequence (None: all P)
    tree_mask: torch.Tensor | None = None,  # [S, S] bool (or [1, 1]: broadcast), True where row i may see new row j
) -> torch.Tensor:  # -> [B, S, Hq * D]
    """Causal attention of S new queries over P past positions plus the S new positions.

    Grouped-query heads are handled by reshaping the queries to [B, Hkv, G*S, D] (query head h uses
    kv head h // G), so the cache is never repeated. Cache row = position, so with a sliding `window` the
    new query i (row P + i) sees only keys at rows > P + i - window, in both blocks (transformers'
    `kv_idx > q_idx - sliding_window`); every row stays in the buffer, the mask hides the old ones.
    `softcap` applies cap * tanh(score / cap) before masking (Gemma's attention logit soft-capping).
    `past_lengths` (a batch of sequences of different lengths in one pass, the batched portable graph): sequence
    b's past is rows [0, L_b) of its block; rows [L_b, P) are hidden and its new query i sits at position L_b + i.
    A length >= P means all P rows (the graph's default), so B = 1 without it computes what it always did.
    `tree_mask` (a token tree verified in one pass, docs/trees.md): new row i sees new row j only where the mask is
    true (and j <= i): its ancestors and itself. Row i's position offset is then its depth (the mask's row sum - 1),
    which the window uses; the caller's position_ids carry the same depths. Without it (or [[True]]) the rows
    form a chain, offset = row.
    """
    b, s, hq, d = q.shape
    hkv = k_new.shape[2]
    g = hq // hkv
    qg = q.reshape(b, s, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * s, d)
    kp = k_past.permute(0, 2, 3, 1)  # [B, Hkv, D, P]
    kn = k_new.permute(0, 2, 3, 1)  # [B, Hkv, D, S]
    scores_past = torch.matmul(qg, kp) * scale  # [B, Hkv, G*S, P]
    scores_new = torch.matmul(qg, kn) * scale  # [B, Hkv, G*S, S]
    if softcap is not None:
        scores_past = torch.tanh(scores_past / softcap) * softcap
        scores_new = torch.tanh(scores_new / softcap) * softcap
    idx = torch.arange(s, device=q.device)
    visible = idx[None, :] <= idx[:, None]  # [S, S] causal
    if tree_mask is not None:
        visible = visible & tree_mask
    depth = visible.sum(-1) - 1  # [S]: each new row's position offset (a chain: its index)
    row = depth.repeat(g)[:, None]  # query's position offset within the new block, [G*S, 1]
    col = depth[None, :]
    lowest = torch.finfo(scores_new.dtype).min
    hidden_new = ~visible.repeat(g, 1)  # [G*S, S]
    p_len = scores_past.shape[-1]
    if past_lengths is not None:
        past_col = torch.arange(p_len, device=q.device)[None, :]  # [1, P]: key row (= position)
        valid = past_col < past_lengths[:, None]  # [B, P]
        hidden_past = ~valid[:, None, None, :]  # [B, 1, 1, P]
        if window is not None:
            length = valid.sum(-1)[:, None, None, None]  # [B, 1, 1, 1]: min(L_b, P)
            hidden_past = hidden_past | (row + length - past_col >= window)  # [B, 1, G*S, P]
        scores_past = scores_past.masked_fill(hidden_past, lowest)
    elif window is not None:
        past_col = torch.arange(p_len, device=q.device)[None, :]  # [1, P]: key row (= position)
        scores_past = scores_past.masked_fill(row + p_len - past_col >= window, lowest)
    if window is not None:
        hidden_new = hidden_new | (row - col >= window)
    scores_new = scores_new.masked_fill(hidden_new, lowest)
    probs = torch.softmax(torch.cat((scores_past, scores_new), dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(probs[..., :p_len], v_past.transpose(1, 2)) + torch.matmul(
        probs[..., p_len:], v_new.transpose(1, 2)
    )  # [B, Hkv, G*S, D]
    return out.reshape(b, hkv, g, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, hq * d)


ACTIVATIONS = {
    "silu": nn.functional.silu,
    "gelu": nn.functional.gelu,
    "gelu_new": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "relu": nn.functional.relu,
}
