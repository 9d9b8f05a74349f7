"""Validation of the Generator's keyword options, before any backend runs (a bad value leaves it usable)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import InvalidArgument

_OPTIONS = ("temperature", "top_k", "top_p", "seed", "method", "num_speculative_tokens", "ngram_min", "ngram_max",
            "proposer", "policy", "on_step", "strict")


def check_options(public: str, options: dict[str, Any]) -> None:
    """A misspelled keyword names the public method, not an internal one."""
    for name in options:
        if name not in _OPTIONS:
            raise TypeError(f"Generator.{public}() got an unexpected keyword argument {name!r}; "
                            f"options: {', '.join(_OPTIONS)}")


def check_k(k: int | str, max_draft_tokens: int) -> int | str:
    """num_speculative_tokens: "auto" or an int in [0, max_draft_tokens] (the bundle's compiled maximum)."""
    if k == "auto":
        return k
    if isinstance(k, str):
        try:
            k = int(k)
        except ValueError:
            raise InvalidArgument(f"num_speculative_tokens must be an integer or 'auto', got {k!r}") from None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidArgument(f"num_speculative_tokens must be an integer or 'auto', got {k!r}")
    if not 0 <= k <= max_draft_tokens:
        raise InvalidArgument(
            f"num_speculative_tokens={k} is outside [0, {max_draft_tokens}] "
            f"(the bundle was compiled with --max-draft-tokens {max_draft_tokens})"
        )
    return int(k)
