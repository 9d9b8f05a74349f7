"""A draft initialised from the target's own layers (before distillation).

The draft keeps the target's architecture and widths and takes a few of its decoder layers, evenly spaced
(first and last included), plus the embedding, the final norm and the LM head. Such a draft starts out
speaking the target's language (its residual stream, norms and head are the target's), so distillation only
has to teach the chosen layers to stand in for the skipped ones.

    ids = pick_layers(30, num_layers=4)              # (0, 10, 19, 29)
    draft = draft_from_target(target_model, ids)     # a transformers model of the target's class
"""
from __future__ import annotations

import copy
from typing import Sequence


def pick_layers(total: int, *, layers: Sequence[int] | None = None, num_layers: int | None = None) -> tuple[int, ...]:
    """The target layer indices the draft copies: `layers` as given (checked), or `num_layers` evenly spaced
    from 0 to total - 1. Raises ValueError naming the bad value."""
    if (layers is None) == (num_layers is None):
        raise ValueError("give exactly one of layers or num_layers")
    if layers is not None:
        ids = tuple(int(i) for i in layers)
        if not ids:
            raise ValueError("layers must name at least one target layer")
        bad = [i for i in ids if not 0 <= i < total]
        if bad:
            raise ValueError(f"layer {bad[0]} is outside the target's layers 0..{total - 1}")
        if list(ids) != sorted(set(ids)):
            raise ValueError(f"layers must be strictly increasing, got {','.join(map(str, ids))}")
        return ids
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in [1, {total}] (the target has {total} layers), got {num_layers}")
    if num_layers == 1:
        return (0,)
    return tuple(round(i * (total - 1) / (num_layers - 1)) for i in range(num_layers))


def parse_layers(text: str) -> tuple[int, ...]:
    """'0,10,20,29' -> (0, 10, 20, 29); ValueError on anything else."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"layers must be comma-separated integers like 0,10,20,29, got {text!r}") from None


def draft_config(target_config, ids: Sequence[int]):
    """The target's config with only the chosen layers (per-layer lists such as layer_types follow them)."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = len(ids)
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = [target_config.layer_types[i] for i in ids]
    if getattr(cfg, "max_window_layers", None) is not None:  # Qwen: layers below it use the sliding window
        cfg.max_window_layers = sum(1 for i in ids if i < target_config.max_window_layers)
    return cfg


def layer_state(target_state: dict, ids: Sequence[int]) -> dict:
    """The draft's state dict: target layer ids[j] becomes draft layer j; every non-layer tensor is kept."""
    out = {}
    where = {str(src): str(dst) for dst, src in enumerate(ids)}
    for name, tensor in target_state.items():
        parts = name.split(".")
        if "layers" in parts:
            k = parts.index("layers") + 1
            if parts[k] not in where:
                continue
            parts[k] = where[parts[k]]
        out[".".join(parts)] = tensor.detach().clone()
    return out


def draft_from_target(target, ids: Sequence[int]):
    """A model of the target's class holding target layers `ids` plus embedding, final norm and head."""
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_config(draft_config(target.config, ids))
    missing, unexpected = draft.load_state_dict(layer_state(target.state_dict(), ids), strict=False)
    tied = {"lm_head.weight"} if getattr(draft.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"draft and target layouts differ: missing {sorted(missing)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]}")
    if tied:
        draft.tie_weights()
    return draft.to(next(target.parameters()).dtype)
