"""Validation of a call's prompt, before any backend runs (request fields: runtime/request.py)."""

from __future__ import annotations

import numpy as np

from specrt.core.errors import InvalidArgument

def sampling_params(temperature: Any, top_k: Any, top_p: Any, seed: Any) -> "SamplingParams":
    """SamplingParams from caller values, with a clear error for None, strings, NaN or fractional top_k (a raw
    float()/int() conversion would raise TypeError/ValueError from deep inside)."""
    from specrt.runtime.sampling import SamplingParams

    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidArgument(f"{name} must be a number, got {value!r}")
    if isinstance(top_k, (float, np.floating)) and float(top_k).is_integer():
        top_k = int(top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
        raise InvalidArgument(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    return SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), seed=seed)


def check_threads(threads: Any) -> int | None:
    """CPU threads per model: None (all cores) or an integer in [1, max(64, 4 x cores)] (more only
    oversubscribes the machine; ONNX Runtime would create every one of them)."""
    import os

    if threads is None:
        return None
    limit = max(64, 4 * (os.cpu_count() or 1))
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= threads <= limit:
        raise InvalidArgument(f"threads must be an integer in [1, {limit}] (this machine has {os.cpu_count()} "
                              f"cores), got {threads!r}")
    return int(threads)


def check_text(text: str, what: str) -> str:
    """`text` must be encodable Unicode (no lone surrogates, e.g. undecodable bytes from a command line)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} holds a character that is not valid Unicode text ({text[exc.start]!r} "
                              f"at index {exc.start}: a lone surrogate or undecodable byte)") from None
    return text



def prompt_ids(prompt, tokenizer, bos_id: int | None, vocab_size: int, max_seq_len: int) -> np.ndarray:
    """Token ids [N] of `prompt` (a str, or a sequence of ids), with a clear error for every bad prompt."""
    if isinstance(prompt, (bytes, bytearray, memoryview)):  # iterating bytes would give "token ids"
        raise InvalidArgument("prompt must be a str or a sequence of token ids, got bytes: decode it first "
                              "(e.g. prompt.decode('utf-8'))")
    if isinstance(prompt, str):
        if not prompt:  # a tokenizer that adds BOS would turn "" into [BOS]: the server refuses "", so does this
            raise InvalidArgument("empty prompt: give at least one character or token id")
        ids = tokenizer.encode(check_text(prompt, "prompt"))
    else:
        if not hasattr(prompt, "__iter__"):
            raise InvalidArgument(f"prompt must be a str or a sequence of token ids, got {type(prompt).__name__}")
        if any(isinstance(t, str) for t in prompt):
            raise InvalidArgument("a token-id prompt must hold integers only, got strings: for several prompts at "
                                  "once use the batch engine (gen.engine().generate_batch(prompts))")
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in prompt):
            raise InvalidArgument("a token-id prompt must hold integers only")
        ids = [int(t) for t in prompt]
    if not ids:  # refused everywhere (Python API, batch engine, --prompts-file, server), as vLLM refuses it
        raise InvalidArgument("empty prompt: give at least one character or token id")
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
