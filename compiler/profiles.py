"""Optimization profiles: min / opt / max shapes per graph input for prefill, decode and verify.

They are recorded in the manifest for every bundle and become TensorRT optimization profiles (one
execution context each) when engines are built. The runtime checks every call against them in Python.
"""

from __future__ import annotations

from typing import Any

from . import graph_io


def profile_ranges(max_seq_len: int, max_draft_tokens: int, max_prefill: int | None = None
                   ) -> dict[str, dict[str, tuple[int, int, int]]]:
    """(min, opt, max) of S (new tokens) and P (past length) per phase."""
    prefill_max = max_prefill or max_seq_len
    verify_max = max_draft_tokens + 1
    return {
        "prefill": {"S": (1, min(128, prefill_max), prefill_max), "P": (0, 0, 0)},
        "decode": {"S": (1, 1, 1), "P": (0, max_seq_len // 2, max_seq_len - 1)},
        "verify": {"S": (2, verify_max, verify_max), "P": (0, max_seq_len // 2, max_seq_len - 2)},
    }


def profiles_for_model(config: Any, max_seq_len: int, max_draft_tokens: int) -> dict[str, Any]:
    """Per phase, per input name: {"min": shape, "opt": shape, "max": shape}."""
    out: dict[str, Any] = {}
    kv = (config.num_kv_heads, config.head_dim)
    for phase, r in profile_ranges(max_seq_len, max_draft_tokens).items():
        shapes: dict[str, Any] = {}
        for which, idx in (("min", 0), ("opt", 1), ("max", 2)):
            s, p = r["S"][idx], r["P"][idx]
            shapes.setdefault(graph_io.INPUT_IDS, {})[which] = [1, s]
            shapes.setdefault(graph_io.POSITION_IDS, {})[which] = [1, s]
            for i in range(config.num_layers):
                for name in (graph_io.past_key(i), graph_io.past_value(i)):
                    shapes.setdefault(name, {})[which] = [1, p, *kv]
        out[phase] = shapes
    return out


def phase_for(new_tokens: int, past_len: int, max_seq_len: int, max_draft_tokens: int) -> str:
    """Which profile a call with S new tokens and P past positions falls into (ValueError if none)."""
    for phase, r in profile_ranges(max_seq_len, max_draft_tokens).items():
        if r["S"][0] <= new_tokens <= r["S"][2] and r["P"][0] <= past_len <= r["P"][2]:
            return phase
    raise ValueError(
        f"no optimization profile covers S={new_tokens} new tokens at past length {past_len} "
        f"(max_seq_len={max_seq_len}, max_draft_tokens={max_draft_tokens})"
    )
