"""The prefix cache's memory budget (runtime/batch/prefix_cache.py): its default and its check, importable by the CLI
without numpy or ONNX Runtime."""

from __future__ import annotations

from specrt.core.errors import InvalidArgument

DEFAULT_PREFIX_CACHE_MB = 256  # SmolLM2-135M: 45 KiB of KV a token, ~5,800 tokens
MB = 1 << 20


def check_budget_mb(mb) -> float:
    """The prefix cache budget in MiB (0: off), validated; the bad value in the message."""
    if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not 0 <= mb < float("inf"):
        raise InvalidArgument(f"prefix_cache_mb must be a number of MiB >= 0 (0 turns the prefix cache off), "
                              f"got {mb!r}")
    return float(mb)
