"""The decoder contract every architecture family implements, and helpers shared by them.

    forward(input_ids [B, S] int64, position_ids [B, S] int64,
            past_keys   tuple of L tensors [B, P, Hkv, D],
            past_values tuple of L tensors [B, P, Hkv, D])
      -> DecoderOutput(logits [B, S, V] fp32, hidden_states [B, S, hidden], new_keys, new_values)

`new_keys` / `new_values` hold only the S new positions ([B, S, Hkv, D] per layer): the caller owns
the cache and places them at rows [P, P + S). `hidden_states` is the final hidden state after the final
norm, i.e. exactly the input of `lm_head` (Medusa heads read it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from specrt.core.errors import CheckpointError
from specrt.models.config import DecoderConfig


class DecoderOutput(NamedTuple):
    logits: torch.Tensor  # [B, S, V] fp32
    hidden_states: torch.Tensor  # [B, S, hidden]
    new_keys: tuple[torch.Tensor, ...]  # L x [B, S, Hkv, D]
    new_values: tuple[torch.Tensor, ...]  # L x [B, S, Hkv, D]


class Decoder(nn.Module):
    """Base class: subclasses define `forward` with the contract above, an `lm_head` (nn.Linear) and
    `input_embedding()`; a config with tie_word_embeddings shares the embedding's weight with the head."""

    config: DecoderConfig
    lm_head: nn.Linear

    def input_embedding(self) -> nn.Embedding:
        raise NotImplementedError

    def lm_head_weight(self) -> torch.Tensor:  # [V, hidden]
        return self.lm_head.weight

    def hf_state_dict_keys(self) -> set[str]:
        """Checkpoint keys this module expects (tied lm_head excluded)."""
        keys = set(self.state_dict().keys())
        if self.config.tie_word_embeddings:
            keys.discard("lm_head.weight")
        return keys

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load Hugging Face-named tensors; missing keys or wrong shapes are an error the caller reports (other keys
        are not read, as transformers ignores them). A config that ties the embeddings while the weights hold an
        lm_head.weight of other values is refused: transformers would not tie them, so the outputs would differ."""
        missing = self.hf_state_dict_keys() - set(tensors)
        if missing:
            shown = ", ".join(sorted(missing)[:5])
            raise CheckpointError(f"checkpoint is missing {len(missing)} weight(s), e.g. {shown}")
        own = self.state_dict()
        for name in self.hf_state_dict_keys():
            src = tensors[name]
            if tuple(src.shape) != tuple(own[name].shape):
                raise CheckpointError(
                    f"weight {name} has shape {tuple(src.shape)}, config.json implies {tuple(own[name].shape)}"
                )
        self.load_state_dict({k: tensors[k] for k in self.hf_state_dict_keys()}, strict=False)
        self.tie_weights()
        head = tensors.get("lm_head.weight")
        if getattr(self.config, "tie_word_embeddings", False) and head is not None:
            tied = self.lm_head_weight()
            if tuple(head.shape) != tuple(tied.shape) or not torch.equal(head.to(tied.dtype), tied):
                raise CheckpointError(
                    "config.json ties the embeddings (tie_word_embeddings true) but the weights hold an lm_head.weight "
                    "that differs from them (transformers would not tie them, and its outputs would differ): set "
                    "\"tie_word_embeddings\": false in config.json, or remove lm_head.weight if it is stale")

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.input_embedding().weight


def empty_past(config: DecoderConfig, past_len: int = 0, dtype=torch.float32, device="cpu"):
    """Zero past caches of `past_len` positions: (keys, values), each L x [1, P, Hkv, D]."""
    shape = (1, past_len, config.num_kv_heads, config.head_dim)
    keys = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers))
    values = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers))
    return keys, values
