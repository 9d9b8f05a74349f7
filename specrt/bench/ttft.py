"""`--ttft-prompt-tokens N`: time to first token on one long prompt of exactly N tokens, ours and the peers'.

The prompt is real text (the built-in prompts of every suite, repeated) tokenized with the bundle's
tokenizer and cut to N tokens. Per repeat: ours (plain decoding: the first token comes from the prefill,
whatever the method), then each interleaved peer on the same ids; medians and spread over repeats.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.bench import predict, suites
from specrt.bench.measure import settle


def long_prompt(gen, n: int) -> np.ndarray:
    """N token ids of real text; refuses N that leaves no room for one new token in the bundle's context."""
    if n < 1:
        raise InvalidArgument(f"--ttft-prompt-tokens must be >= 1, got {n}")
    if n + 1 > gen.max_seq_len:
        raise InvalidArgument(f"--ttft-prompt-tokens {n} does not fit the bundle's max_seq_len={gen.max_seq_len} "
                              "(prompt + 1 new token)")
    text = "\n\n".join(t for texts in suites.BUILTIN.values() for t in texts)
    piece = list(gen.tokenizer.encode(text))
    ids = (piece * (n // max(len(piece), 1) + 1))[:n]
    return np.asarray(ids, dtype=np.int64)


def ours_seconds(gen, ids: np.ndarray) -> float:
    t0 = time.perf_counter()
    for _chunk, _stats in gen.stream_tokens(ids, 1, method="none"):
        break
    return time.perf_counter() - t0


def measure(gen, sessions, n: int, repeats: int, tick: Callable[[str], None]) -> dict[str, Any]:
    ids = long_prompt(gen, n)
    ours_seconds(gen, ids)  # warm-up (first-use allocations at this length)
    for s in sessions:
        s.peer.first_token_seconds(ids.tolist())
    ours: list[float] = []
    theirs: dict[str, list[float]] = {s.peer.name: [] for s in sessions}
    for r in range(repeats):
        tick(f"time to first token, {n} tokens, repeat {r + 1}")
        ours.append(ours_seconds(gen, ids))
        for s in sessions:
            settle()
            theirs[s.peer.name].append(s.peer.first_token_seconds(ids.tolist()))
        if sessions:
            settle()
    out: dict[str, Any] = {"prompt_tokens": n, "repeats": repeats, "ours_seconds": predict.spread(ours), "peers": {}}
    for name, values in theirs.items():
        spread = predict.spread(values)
        out["peers"][name] = {"seconds": spread,
                              "ratio_theirs_over_ours": spread["median"] / out["ours_seconds"]["median"]}
    return out


def line(t: dict[str, Any]) -> str:
    """'time to first token (1000-token prompt): ours 812 ms; ort-genai 905 ms (1.11x ours); ...'"""
    parts = [f"ours {1000 * t['ours_seconds']['median']:.0f} ms"]
    for name, p in t["peers"].items():
        parts.append(f"{name} {1000 * p['seconds']['median']:.0f} ms ({p['ratio_theirs_over_ours']:.2f}x ours)")
    return f"time to first token ({t['prompt_tokens']}-token prompt, median of {t['repeats']}): " + "; ".join(parts)
