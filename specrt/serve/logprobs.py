"""logprobs in OpenAI's response shapes (issue 53).

The worker turns each step's `TokenLogprob`s (runtime/logits_processors.py: the target's log-probabilities after
the request's penalties and logit_bias, before temperature / top-k / top-p) into neutral entries
`{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}`, which are chat's
`choices[].logprobs.content` items as they are; `completion_shape` rearranges them into /v1/completions'
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset`.
A token's string is its own decoding (special tokens kept); a piece of a multi-byte character decodes to U+FFFD,
so `bytes` holds that string's UTF-8 (as OpenAI's, it may not be the token's exact bytes).
"""

from __future__ import annotations

from typing import Any, Sequence


def _token(tokenizer: Any, token_id: int, cache: dict) -> tuple[str, list[int]]:
    if token_id not in cache:
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        cache[token_id] = (text, list(text.encode("utf-8", "replace")))
    return cache[token_id]


def entries(tokenizer: Any, token_logprobs: Sequence[Any], cache: dict) -> list[dict[str, Any]]:
    """TokenLogprob list -> chat-shaped entries; `cache` (token id -> string, bytes) is kept per request."""
    out = []
    for t in token_logprobs:
        text, raw = _token(tokenizer, t.token_id, cache)
        top = []
        for tid, lp in t.top:
            s, b = _token(tokenizer, tid, cache)
            top.append({"token": s, "logprob": lp, "bytes": b})
        out.append({"token": text, "logprob": t.logprob, "bytes": raw, "top_logprobs": top})
    return out


def completion_shape(items: Sequence[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """Chat-shaped entries -> /v1/completions' logprobs object; `offset`: text length before the first item."""
    offsets = []
    for e in items:
        offsets.append(offset)
        offset += len(e["token"])
    return {"tokens": [e["token"] for e in items], "token_logprobs": [e["logprob"] for e in items],
            "top_logprobs": [_top_dict(e["top_logprobs"]) for e in items],
            "text_offset": offsets}


def _top_dict(top: Sequence[dict[str, Any]]) -> dict[str, float]:
    """OpenAI's {token string: logprob}; tokens with the same string (pieces of characters) keep the likeliest."""
    out: dict[str, float] = {}
    for t in top:  # most likely first
        out.setdefault(t["token"], t["logprob"])
    return out


def shaped(items: Sequence[dict[str, Any]], chat: bool, offset: int = 0) -> dict[str, Any]:
    return {"content": list(items)} if chat else completion_shape(items, offset)
