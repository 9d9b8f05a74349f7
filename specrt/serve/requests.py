"""Validate a parsed request against the bundle and turn it into a `Job` (runs in a worker thread).

Every check names the field (`param`) and the bad value; nothing here touches a model runner.
Defaults follow OpenAI: temperature 1, top_p 1, max_tokens 16 for completions and "the rest of the
context" for chat.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Optional

from specrt.core.errors import InvalidArgument
from specrt.runtime.chat_template import ChatFormatter
from specrt.serve.config import ServeConfig
from specrt.runtime.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE
from specrt.serve.errors import APIError, bad_request
from specrt.serve.guards import check_text, check_unsupported
from specrt.serve.worker import Job

COMPLETION_DEFAULT_MAX_TOKENS = 16
MAX_STOP_STRINGS = 16


@dataclasses.dataclass
class Prepared:
    job: Job
    chat: bool
    stream: bool
    include_usage: bool
    request_id: str
    created: int


def _encode(gen: Any, prompt: Any, add_special_tokens: bool = True) -> list[int]:
    try:
        if isinstance(prompt, str) and not add_special_tokens:
            prompt = gen.tokenizer.encode(prompt, add_special_tokens=False)
        return gen.encode_prompt(prompt).tolist()
    except InvalidArgument as exc:
        raise bad_request(str(exc), "prompt") from None


def _prompt_ids(gen: Any, prompt: Any) -> list[int]:
    check_text(prompt, "prompt")
    if isinstance(prompt, list):
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise bad_request(f"batched prompts are not supported (got {len(prompt)}): send one prompt "
                                  "per request", "prompt")
            prompt = prompt[0]
    if isinstance(prompt, (str, list)) and len(prompt) == 0:
        raise bad_request("prompt must not be empty", "prompt")
    return _encode(gen, prompt)


def _stops(stop: Any) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(s == "" for s in stops):
        raise bad_request("stop strings must not be empty", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(stops)}", "stop")
    return stops


def _speculation(body: Any, gen: Any, config: ServeConfig) -> dict[str, Any]:
    spec = body.speculative
    method = (spec.method if spec else None) or config.method
    if method is not None and method not in gen.methods:
        raise bad_request(f"speculative method {method!r} is not available with this bundle; choose one of "
                          f"{', '.join(gen.methods)}", "speculative.method")
    k = spec.num_speculative_tokens if spec and spec.num_speculative_tokens is not None \
        else config.num_speculative_tokens
    if k != "auto" and not 0 <= k <= gen.max_draft_tokens:
        raise bad_request(f"num_speculative_tokens={k} is outside [0, {gen.max_draft_tokens}] (the bundle was "
                          f"compiled with --max-draft-tokens {gen.max_draft_tokens})",
                          "speculative.num_speculative_tokens")
    return {"method": method, "num_speculative_tokens": k}


def _job(body: Any, gen: Any, config: ServeConfig, prompt_ids: list[int], max_tokens: Optional[int],
         default_max_tokens: int, chat: bool) -> Prepared:
    check_unsupported(body)
    check_text(body.stop, "stop")
    if body.seed is not None and not 0 <= body.seed < 2**63:
        raise bad_request(f"seed must be an integer in [0, 2**63), got {body.seed}", "seed")
    if body.n != 1:
        raise bad_request(f"n={body.n} is not supported: this server returns exactly one choice (n=1)", "n")
    if body.model is not None and body.model != config.served_model_name:
        raise APIError(400, f"unknown model {body.model!r}; this server serves {config.served_model_name!r}",
                       param="model", code="model_not_found")
    temperature = 1.0 if body.temperature is None else float(body.temperature)
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):  # also NaN / inf
        raise bad_request(f"temperature must be >= 0: 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE:g}], "
                          f"got {temperature}", "temperature")
    top_p = 1.0 if body.top_p is None else float(body.top_p)
    if not 0 < top_p <= 1:
        raise bad_request(f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = body.top_k or 0
    if top_k < 0:
        raise bad_request(f"top_k must be >= 0, got {top_k}", "top_k")
    context = gen.max_seq_len
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif max_tokens < 1:
        raise bad_request(f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    if len(prompt_ids) + max_tokens > context:
        raise bad_request(f"this model's maximum context length is {context} tokens, but {len(prompt_ids)} prompt "
                          f"tokens + max_tokens={max_tokens} = {len(prompt_ids) + max_tokens}; lower max_tokens "
                          "or shorten the prompt", "max_tokens", code="context_length_exceeded")
    kwargs = dict(temperature=temperature, top_p=top_p, top_k=top_k, seed=body.seed,
                  **_speculation(body, gen, config))
    job = Job(prompt_ids, max_tokens, kwargs, _stops(body.stop))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    return Prepared(job, chat, body.stream, include_usage, rid, int(time.time()))


def prepare_completion(body: Any, gen: Any, config: ServeConfig) -> Prepared:
    ids = _prompt_ids(gen, body.prompt)
    default = min(COMPLETION_DEFAULT_MAX_TOKENS, gen.max_seq_len - len(ids))
    return _job(body, gen, config, ids, body.max_tokens, default, chat=False)


def prepare_chat(body: Any, gen: Any, config: ServeConfig, formatter: ChatFormatter) -> Prepared:
    if not body.messages:
        raise bad_request("messages must hold at least one message", "messages")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    for i, m in enumerate(messages):
        check_text([m["role"], m["content"]], f"messages.{i}")
    try:
        text, add_special = formatter.render(messages)
    except InvalidArgument as exc:
        raise bad_request(str(exc), "messages") from None
    ids = _encode(gen, text, add_special)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return _job(body, gen, config, ids, max_tokens, gen.max_seq_len - len(ids), chat=True)
