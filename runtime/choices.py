"""`generate_choices`: n choices of one request in the Python API (the server's `n`).

    results = generate_choices(gen, "Once upon a time", 4, temperature=0.8, seed=7, max_new_tokens=64)
    engine = gen.engine(max_batch=8)                                    # or on the batch: the n decode together
    results = generate_choices(engine, "Once upon a time", 4, temperature=0.8, seed=7)
    engine.close()

Choice i is the request with seed `choice_seed(seed, i)` = (seed + i) mod 2**63 (`GenerationRequest.for_choice`):
reproducible, and choice 0 is the request itself. Greedy choices would all be the same text, so the prompt is decoded
once and the n results are copies of it. On a Generator the choices run one after the other; on a `BatchEngine` as
n sequences of the batch, admitted together: the prompt is prefilled once and its KV rows copied to the
others (runtime/batch/shared_prompt.py; fused CPU pools).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from specrt.runtime.prepared import PreparedRequest, prepare_call
from specrt.runtime.request import MAX_CHOICES, GenerationRequest, RequestFieldError, _is_int


def generate_choices(gen: Any, prompt: str | Sequence[int], n: int, *, request: GenerationRequest | None = None,
                     **options: Any) -> list:
    """n GenerationResults for `prompt` (a Generator or a BatchEngine; options as `Generator.generate`)."""
    if not _is_int(n) or not 1 <= n <= MAX_CHOICES:
        raise RequestFieldError("n", f"n must be an integer in [1, {MAX_CHOICES}], got {n!r}")
    engine = gen if hasattr(gen, "generate_batch") and hasattr(gen, "scheduler") else None
    base = engine.gen if engine is not None else gen
    max_new = options.pop("max_new_tokens", None)
    base._check_open()
    prepared = prepare_call(base, "generate_choices", prompt, max_new, request, options)  # checked once
    if prepared.request.sampling.greedy:
        one = _run(gen, engine, prepared)
        return [one] + [copy.deepcopy(one) for _ in range(n - 1)]
    choices = [prepared.for_choice(i) for i in range(n)]
    if engine is None:
        return [_run(gen, None, p) for p in choices]
    return engine.generate_batch(choices)  # admitted together: one prefill (shared_prompt.py)


def _run(gen: Any, engine: Any, prepared: PreparedRequest) -> Any:
    return engine.generate_batch([prepared])[0] if engine is not None else gen.generate(prepared)
