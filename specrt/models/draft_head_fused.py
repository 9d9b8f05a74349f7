"""The fused draft head (EAGLE-3's input): the head of draft_head.py whose fc also reads three of the target's layers.

Per row t:

    z_t      = [rms(l_t) ; rms(m_t) ; rms(u_t)]   the target's residual stream after a low, a middle and a high
                                                  layer (`feature_layers`), each RMS-normalised (no weight); zeros
                                                  on draft rows, where only the head's own feature exists
    x_t      = fc([f_t ; e(tok_{t+1}) ; z_t])     fc: 5D -> D, initialised to [I | I | 0] (the plain head's start)
    y_t, h_t, logits_t                            as in DraftHead (one target-architecture layer, the target's final
                                                  norm and its lm_head rows of the V' kept tokens)

f_t is the target's final hidden state (after its final norm) on rows the target computed, and the head's own h
of the row before on draft rows, as in DraftHead. Only fc and the layer train.

`ttt_forward` runs the head's layer over several draft depths at once for training-time test (EAGLE-3): depth j's
row r continues the chain anchored at row r - j, so it sees the depth-0 keys of rows <= r - j, the depth-i key of
row r - j + i for 1 <= i < j, and itself: exactly the cache a drafting head has at that point. Llama-family
layers only (the rope family: Llama, Mistral, Qwen2, Qwen3).
"""

from __future__ import annotations

import torch
from torch import nn

from specrt.models.base import Decoder
from specrt.models.draft_head import DraftHead


def layer_taps(decoder: Decoder, layers: tuple[int, ...]) -> tuple[list, list]:
    """Forward hooks keeping the residual stream after each of `layers` (0-based; a block's output): (the list the
    outputs land in, in `layers` order, [B, S, D] each; the hook handles to remove). What the recipe's data holds
    (recipes/head_shards.py) and what the target graphs' `hidden_layers` output is checked against."""
    blocks = decoder.transformer.h if decoder.config.family == "gpt2" else decoder.model.layers
    got: list = [None] * len(layers)

    def keep(j):
        def hook(_module, _inputs, output):
            got[j] = output[0]
        return hook

    return got, [blocks[i].register_forward_hook(keep(j)) for j, i in enumerate(layers)]


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class FusedDraftHead(DraftHead):
    """forward(features [B,S,D], input_ids, position_ids [B,S], past_key/value [B,P,Hkv,Dh],
    layer_features [B,S,3,D] or None (draft rows)) -> (logits [B,S,V'], hidden [B,S,D], new_key, new_value)."""

    def __init__(self, target: Decoder, vocab_ids: torch.Tensor, feature_layers: tuple[int, ...]) -> None:
        super().__init__(target, vocab_ids)
        d, n = target.config.hidden_size, len(feature_layers)
        self.feature_layers = tuple(int(i) for i in feature_layers)
        self.fc = nn.Linear((2 + n) * d, d)
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, :2 * d].copy_(torch.cat((torch.eye(d), torch.eye(d)), dim=1))
            self.fc.bias.zero_()

    def set_vocab(self, target_lm_weight: torch.Tensor, vocab_ids: torch.Tensor) -> None:
        """Swap the frozen reduced vocabulary (no trained parameter depends on it)."""
        ids = vocab_ids.to(torch.long)
        self.lm_weight = target_lm_weight.detach()[ids].float().clone()
        self.vocab_ids = ids.clone()

    def fc_input(self, features, input_ids, position_ids, layer_features) -> torch.Tensor:  # -> [B, S, D]
        b, s, d = features.shape
        n = len(self.feature_layers)
        z = features.new_zeros(b, s, n * d) if layer_features is None else rms(layer_features).reshape(b, s, n * d)
        return self.fc(torch.cat((features, self.embed(input_ids, position_ids), z), dim=-1))

    def forward(self, features, input_ids, position_ids, past_key, past_value, layer_features=None):
        x = self.fc_input(features, input_ids, position_ids, layer_features)
        if self.kind == "gpt2":
            y, k, v = self.layer(x, past_key, past_value)
        else:
            cos, sin = self.rotary.cos_sin(position_ids)
            y, k, v = self.layer(x, cos, sin, past_key, past_value)
        return (*self.head_out(y), k, v)

    def head_out(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.norm(y)
        logits = torch.matmul(hidden, self.lm_weight.T).float()
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits, hidden


def ttt_mask(rows: int, depth: int) -> torch.Tensor:
    """[R, (depth + 1) * R] bool: what depth `depth`'s row r sees among the keys of depths 0..depth (see above)."""
    r = torch.arange(rows)
    blocks = [r[None, :] <= r[:, None] - depth]  # depth 0: rows <= r - depth
    blocks += [r[None, :] == r[:, None] - depth + i for i in range(1, depth + 1)]
    return torch.cat(blocks, dim=1)


def ttt_layer(head: FusedDraftHead, x: torch.Tensor, position_ids: torch.Tensor, keys: list, values: list,
              depth: int) -> torch.Tensor:
    """The head's (Llama-family) layer on depth `depth`'s rows x [B,R,D]; `keys` / `values` hold the rotated keys of
    depths 0..depth-1 ([B,R,Hkv,Dh] each) and get this depth's appended. Returns the layer output [B,R,D]."""
    from specrt.models.layers import apply_rotary

    if head.kind != "rope":
        raise ValueError(f"training-time test is built for Llama-family layers, not {head.config.architecture}")
    layer, a, c = head.layer, head.layer.self_attn, head.config
    b, s, _ = x.shape
    h = layer.input_layernorm(x)
    q = a.q_proj(h).view(b, s, c.num_heads, c.head_dim)
    k = a.k_proj(h).view(b, s, c.num_kv_heads, c.head_dim)
    v = a.v_proj(h).view(b, s, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
        q, k = a.q_norm(q), a.k_norm(k)
    if a.rope:  # the copied layer's own setting: SmolLM3's last layer has no rope (as the head module runs it)
        cos, sin = head.rotary.cos_sin(position_ids)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    keys.append(k)
    values.append(v)
    g = c.num_heads // c.num_kv_heads
    kk = torch.cat(keys, dim=1).transpose(1, 2).repeat_interleave(g, dim=1)  # [B, H, (depth+1)R, Dh]
    vv = torch.cat(values, dim=1).transpose(1, 2).repeat_interleave(g, dim=1)
    mask = ttt_mask(s, depth).to(x.device)
    out = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=mask)  # [B, H, R, Dh]
    x = x + a.o_proj(out.transpose(1, 2).reshape(b, s, c.num_heads * c.head_dim))
    return x + layer.mlp(layer.post_attention_layernorm(x))


from specrt.models.head_config import FUSED_VERSION  # noqa: E402 (head_config.json version of a fused head)


def save_fused_head(head: FusedDraftHead, out_dir, extra: dict | None = None,
                    dtype: torch.dtype = torch.float32) -> None:
    """head_config.json (version 2, with `feature_layers`) + head.safetensors (fc [D, 5D] and the layer, stored as
    `dtype`: float32, float16 or int8, see `save_head`)."""
    import json
    from pathlib import Path

    from specrt.models.draft_head import CONFIG, save_head

    save_head(head, out_dir, extra={**(extra or {}), "feature_layers": list(head.feature_layers)}, dtype=dtype)
    path = Path(out_dir) / CONFIG
    cfg = json.loads(path.read_text())
    cfg["version"] = FUSED_VERSION
    path.write_text(json.dumps(cfg) + "\n")


def load_fused_head(head_dir, target: Decoder) -> FusedDraftHead:
    """A fused head directory on `target` (its frozen parts rebuilt from the target). Raises CheckpointError."""
    from pathlib import Path

    from specrt.core.errors import CheckpointError
    from specrt.core.jsonfile import load_json
    from specrt.models.draft_head import CONFIG, WEIGHTS, target_fingerprint
    from specrt.models.head_config import check_head_config
    from specrt.models.head_storage import read_trained

    head_dir = Path(head_dir)
    cfg = load_json(head_dir / CONFIG, CheckpointError)
    want = target_fingerprint(target.config)
    ids = check_head_config(cfg, str(head_dir / CONFIG), target=want, error=CheckpointError,
                            versions=(FUSED_VERSION,))
    if cfg.get("version") != FUSED_VERSION:
        raise CheckpointError(f"{head_dir / CONFIG} is a plain draft head, not a fused one (version {FUSED_VERSION})")
    head = FusedDraftHead(target, torch.tensor(ids, dtype=torch.long), tuple(cfg["feature_layers"]))
    tensors = read_trained(head_dir, cfg)  # fp32, dequantized when stored as int8
    own = head.trained_state()
    if set(tensors) != set(own) or any(tuple(tensors[k].shape) != tuple(own[k].shape) for k in own):
        raise CheckpointError(f"{head_dir / WEIGHTS} does not hold a fused head's fc and layer for this target")
    head.load_state_dict({**head.state_dict(), **tensors})
    return head.eval()
