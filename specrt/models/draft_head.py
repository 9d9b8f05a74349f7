"""An EAGLE-style draft head on the target's hidden states, with a reduced vocabulary (FR-Spec).

Per row t (position t, its own small KV cache, one decoder layer):

    x_t      = fc([f_t ; e(tok_{t+1})])       f_t [D]: the target's final hidden state at position t (after its
                                              final norm: the graphs' `hidden_states` output); e: the target's
                                              own input embedding (frozen, kept in fp16)
    y_t      = layer(x_t)                     a decoder layer of the target's architecture, initialised from the
                                              target's last layer (trained)
    h_t      = norm(y_t)                      the target's final norm (frozen): the head's guess of f_{t+1}, fed
                                              back as the feature of the next draft row
    logits_t = h_t @ W'^T                     W' [V', D]: the target's lm_head rows of the V' kept tokens (frozen);
                                              Gemma 3's final soft-cap applied; index i is token `vocab_ids[i]`

So the head at row t guesses tok_{t+2}; drafting k tokens feeds its own h back k - 1 times. Only `fc` and
`layer` are trained. The target verifies over the full vocabulary, so drafting over V' tokens stays exact.

Head directory (written by `specrt train-head`, read by `specrt compile --draft head:DIR`):
    head_config.json   {"format": "specrt-draft-head", "version": 1, "target": {architecture, hidden_size,
                        vocab_size, num_layers, num_kv_heads, head_dim}, "vocab_ids": [V' ints], ...}
    head.safetensors   fc.weight [D, 2D], fc.bias [D], layer.* (the trained layer), stored as head_config.json's
                       `storage` says: float32, float16, or int8 matrices with per-row scales (head_storage.py)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specrt.models.head_config import FORMAT, FUSED_VERSION, TARGET_KEYS, VERSION, check_head_config
from specrt.core.errors import CheckpointError
from specrt.core.jsonfile import load_json
from specrt.models.base import Decoder

CONFIG = "head_config.json"
WEIGHTS = "head.safetensors"
TRAINED = ("fc.", "layer.")  # parameter prefixes the head directory stores


def target_fingerprint(c) -> dict[str, Any]:
    """The target facts a head depends on (checked when it is compiled against a target)."""
    return {key: getattr(c, key) for key in TARGET_KEYS}


def _parts(target: Decoder):
    """(kind, embedding, last layer, final norm) of a target decoder."""
    family = target.config.family
    if family == "gpt2":
        t = target.transformer
        return "gpt2", t.wte.weight, t.h[-1], t.ln_f
    body = target.model
    return ("gemma3" if family == "gemma3" else "rope"), body.embed_tokens.weight, body.layers[-1], body.norm


class DraftHead(nn.Module):
    """forward(features [B,S,D], input_ids [B,S], position_ids [B,S], past_key/value [B,P,Hkv,D])
    -> (logits [B,S,V'] fp32, hidden [B,S,D], new_key, new_value [B,S,Hkv,D])."""

    def __init__(self, target: Decoder, vocab_ids: torch.Tensor) -> None:
        super().__init__()
        c = target.config
        self.config = c
        self.kind, embed, last, norm = _parts(target)
        d = c.hidden_size
        self.register_buffer("embed_weight", embed.detach().to(torch.float16).clone(), persistent=False)  # [V, D]
        self.embed_scale = float(torch.tensor(d**0.5, dtype=torch.float32)) if self.kind == "gemma3" else None
        if self.kind == "gpt2":
            self.register_buffer("pos_weight", target.transformer.wpe.weight.detach().clone(), persistent=False)
        self.fc = nn.Linear(2 * d, d)
        with torch.no_grad():  # start as feature + embedding: the layer sees a residual-stream-like input
            self.fc.weight.copy_(torch.cat((torch.eye(d), torch.eye(d)), dim=1))
            self.fc.bias.zero_()
        self.layer = copy.deepcopy(last)
        self.norm = copy.deepcopy(norm).requires_grad_(False)
        if self.kind == "rope":
            self.rotary = copy.deepcopy(target.rotary)
        elif self.kind == "gemma3":
            windowed = last.self_attn.window is not None
            self.rotary = copy.deepcopy(target.rotary_local if windowed else target.rotary_global)
        ids = vocab_ids.to(torch.long)
        self.register_buffer("lm_weight", target.lm_head_weight().detach()[ids].float().clone(), persistent=False)
        self.register_buffer("vocab_ids", ids.clone(), persistent=False)  # [V']
        # frozen buffers are rebuilt from the target, never saved (state_dict: fc, layer, norm)
        self.softcap = c.final_logit_softcapping if self.kind == "gemma3" else None

    @property
    def draft_vocab_size(self) -> int:
        return int(self.vocab_ids.numel())

    def trained_parameters(self) -> list[nn.Parameter]:
        return list(self.fc.parameters()) + list(self.layer.parameters())

    def trained_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if k.startswith(TRAINED)}

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:  # -> [B, S, D]
        x = nn.functional.embedding(input_ids, self.embed_weight).float()
        if self.embed_scale is not None:
            x = x * self.embed_scale
        if self.kind == "gpt2":
            x = x + nn.functional.embedding(position_ids, self.pos_weight)
        return x

    def forward(self, features, input_ids, position_ids, past_key, past_value):
        x = self.fc(torch.cat((features, self.embed(input_ids, position_ids)), dim=-1))
        if self.kind == "gpt2":
            y, k, v = self.layer(x, past_key, past_value)
        else:
            cos, sin = self.rotary.cos_sin(position_ids)
            y, k, v = self.layer(x, cos, sin, past_key, past_value)
        hidden = self.norm(y)
        logits = torch.matmul(hidden, self.lm_weight.T).float()
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits, hidden, k, v


def save_head(head: DraftHead, out_dir: Path, extra: dict[str, Any] | None = None,
              dtype: torch.dtype = torch.float32) -> None:
    """Write head_config.json + head.safetensors (the trained fc and layer only) into `out_dir`, stored as `dtype`:
    float32, float16 (half the size) or int8 (weight matrices as int8 with per-row scales, a quarter:
    specrt/models/head_storage.py); `storage` in head_config.json says which, and the loaders return fp32."""
    from safetensors.torch import save_file

    from specrt.models.head_storage import pack, storage_of_dtype

    storage = storage_of_dtype(dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = {"format": FORMAT, "version": 1, "target": target_fingerprint(head.config),
           "draft_vocab_size": head.draft_vocab_size, "storage": storage, **(extra or {}),
           "vocab_ids": [int(i) for i in head.vocab_ids.tolist()]}
    (out_dir / CONFIG).write_text(json.dumps(cfg) + "\n")
    save_file(pack(head.trained_state(), storage), str(out_dir / WEIGHTS), metadata={"format": "pt"})


def read_head_config(head_dir: Path) -> dict[str, Any]:
    """head_config.json, checked, after checking that head.safetensors' header holds the form its `storage` names
    (fails fast, before compile exports anything)."""
    head_dir = Path(head_dir)
    if not (head_dir / CONFIG).is_file() or not (head_dir / WEIGHTS).is_file():
        raise CheckpointError(f"{head_dir} is not a draft-head directory: needs {CONFIG} and {WEIGHTS} "
                              "(written by `specrt train-head`)")
    cfg = load_json(head_dir / CONFIG, CheckpointError)
    check_head_config(cfg, str(head_dir / CONFIG), error=CheckpointError,  # specrt/models/head_config.py
                      versions=(VERSION, FUSED_VERSION))
    from specrt.models.head_storage import check_form, file_layout

    check_form(file_layout(head_dir / WEIGHTS), cfg.get("storage"), str(head_dir))  # its header: the stored form
    return cfg


def head_feature_layers(cfg: dict[str, Any]) -> tuple[int, ...] | None:
    """A fused head's target layers (head_config version 2), None for a plain head."""
    return tuple(cfg["feature_layers"]) if cfg.get("version") == FUSED_VERSION else None


def load_head(head_dir: Path, target: Decoder) -> tuple[DraftHead, dict[str, Any]]:
    """The head in `head_dir` on `target` (its frozen parts rebuilt from the target). Raises CheckpointError."""
    from specrt.models.head_storage import read_trained

    cfg = read_head_config(head_dir)
    if cfg.get("version") == FUSED_VERSION:
        from specrt.models.draft_head_fused import load_fused_head

        return load_fused_head(head_dir, target), cfg
    want = target_fingerprint(target.config)
    if cfg.get("target") != want:
        raise CheckpointError(f"this head was trained for the target {cfg.get('target')}; the target is {want}")
    ids = torch.tensor(check_head_config(cfg, str(Path(head_dir) / CONFIG), target=want, error=CheckpointError),
                       dtype=torch.long)
    head = DraftHead(target, ids)
    tensors = read_trained(Path(head_dir), cfg)  # fp32, dequantized when stored as int8
    own = head.trained_state()
    if set(tensors) != set(own):
        raise CheckpointError(f"{head_dir / WEIGHTS} holds {sorted(tensors)[:4]}..., expected {sorted(own)[:4]}...")
    for name, value in tensors.items():
        if tuple(value.shape) != tuple(own[name].shape):
            raise CheckpointError(f"{head_dir / WEIGHTS}: {name} has shape {tuple(value.shape)}, "
                                  f"expected {tuple(own[name].shape)}")
    head.load_state_dict({**head.state_dict(), **tensors})
    return head.eval(), cfg
