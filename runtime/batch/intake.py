"""The batch engine's intake: a call prepared once (runtime/prepared.py), and the checks only the batch makes.

The engine never resolves a request again: it takes `PreparedRequest`s (or prepares the call once here) and asks
`refusal` whether the batch runs it; the scheduler takes the BatchSequence as it is.
"""

from __future__ import annotations

from typing import Any, Sequence as Seq

from specrt.core.errors import InvalidArgument
from specrt.runtime.prepared import PreparedRequest, prepare_call, prepare_prompt
from specrt.runtime.proposers.auto_sources import batch_refusal
from specrt.runtime.request import GenerationRequest


def prepared(gen, public: str, prompt: Any, max_new_tokens: int | None, request: GenerationRequest | None,
             options: dict) -> PreparedRequest:
    """`prompt` if it is a PreparedRequest (given alone), else the call prepared by the Generator's rules: once."""
    if not isinstance(prompt, PreparedRequest):
        return prepare_call(gen, public.split(".")[-1], prompt, max_new_tokens, request, options)
    if max_new_tokens is not None or request is not None or options:
        raise TypeError(f"{public}() takes a PreparedRequest alone: it holds the whole call")
    return prompt


def refusal(prepared: PreparedRequest, methods: list[str], loop_only: bool = True) -> str:
    """Why the batch does not run `prepared` ("" when it does): a constraint, a method it does not batch, hooks; and
    (`loop_only`, not for `submit`) penalties, logit_bias and logprobs (runtime/logits_processors.py), which the
    engine's `stream_tokens` / `generate_batch` run on the one-request loop instead."""
    request = prepared.request
    if request.constraint is not None:  # structured output runs on the one-request loop (runtime/constrained.py)
        return ("a constraint (response_format) is not supported with batching yet: serve without --max-batch "
                "for structured output")
    if prepared.method not in methods:
        return f"method {prepared.method!r} is not available with batching; choose one of {', '.join(methods)}"
    if prepared.method == "auto" and (why := batch_refusal(request.auto_sources)):
        return why
    if prepared.proposer is not None or prepared.policy is not None or prepared.on_step is not None:
        return "proposer / policy / on_step hooks run on the one-request loop (Generator.generate), not on the batch"
    if loop_only and request.logits_params.active:
        return "penalties, logit_bias and logprobs run on the one-request loop"
    return ""


def prepare_batch(gen, prompts: list, max_new_tokens: int | None, request: GenerationRequest | None,
                  requests: Seq | None, options: dict) -> list[PreparedRequest]:
    """The prompts of `generate_batch`, each prepared once (one request for all of them is resolved once; a bad
    prompt is named by its index). PreparedRequests are taken as they are (given alone)."""
    if prompts and all(isinstance(p, PreparedRequest) for p in prompts):
        if max_new_tokens is not None or request is not None or requests is not None or options:
            raise TypeError("BatchEngine.generate_batch() takes PreparedRequests alone: each holds its call")
        return prompts
    if requests is None:
        reqs = [gen.request("generate_batch", max_new_tokens, request, **options)] * len(prompts)
    else:
        requests = list(requests)
        if len(requests) != len(prompts):
            raise InvalidArgument(f"requests must hold one request per prompt: {len(requests)} for {len(prompts)}")
        reqs = [gen.request("generate_batch", max_new_tokens, r) for r in requests]
    out = []
    for i, (p, r) in enumerate(zip(prompts, reqs)):
        try:
            out.append(prepare_prompt(gen, p, r))
        except InvalidArgument as exc:
            raise InvalidArgument(f"prompt {i}: {exc}") from None
    return out
