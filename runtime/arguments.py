"""Validation of a call's prompt, before any backend runs (request fields: runtime/request.py)."""

from __future__ import annotations

import numpy as np

from specrt.core.errors import InvalidArgument


def prompt_ids(prompt, tokenizer, bos_id: int | None, vocab_size: int, max_seq_len: int) -> np.ndarray:
    """Token ids [N] of `prompt` (a str, or a sequence of ids), with a clear error for every bad prompt."""
    if isinstance(prompt, (bytes, bytearray, memoryview)):  # iterating bytes would give "token ids"
        raise InvalidArgument("prompt must be a str or a sequence of token ids, got bytes: decode it first "
                              "(e.g. prompt.decode('utf-8'))")
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"prompt holds a character that is not valid Unicode text ({prompt[exc.start]!r} "
                                  f"at index {exc.start}: a lone surrogate or undecodable byte)") from None
        ids = tokenizer.encode(prompt)
    else:
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in prompt):
            raise InvalidArgument("a token-id prompt must hold integers only")
        ids = [int(t) for t in prompt]
    if not ids:
        if bos_id is None:
            raise InvalidArgument("empty prompt, and the model has no BOS token to start from")
        ids = [int(bos_id)]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidArgument(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    if len(ids) >= max_seq_len:
        raise InvalidArgument(
            f"prompt has {len(ids)} tokens; the bundle was compiled for max_seq_len={max_seq_len}, "
            f"which leaves room for prompts of at most {max_seq_len - 1} tokens "
            "(recompile with a larger --max-seq-len)"
        )
    return np.asarray(ids, dtype=np.int64)
