"""Validate a parsed request against the bundle and turn it into a `Job` (runs in a worker thread).

Every check names the field (`param`) and the bad value; nothing here touches a model runner.
Sampling fields a request omits come from the bundle's generation_config.json (as vLLM does), else
OpenAI's defaults: temperature 1, top_p 1; max_tokens 16 for completions and "the rest of the context" for chat.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Optional

from specrt.core.errors import InvalidArgument
from specrt.runtime.chat_template import ChatFormatter
from specrt.serve.config import ServeConfig
from specrt.runtime.request import GenerationRequest
from specrt.serve.errors import APIError, bad_request
from specrt.serve.guards import check_text, check_unsupported
from specrt.serve.worker import Job

COMPLETION_DEFAULT_MAX_TOKENS = 16
CHAT_ROLES = ("system", "developer", "user", "assistant")  # developer: OpenAI's newer name of system, rendered as one
OPENAI_TEMPERATURE = 1.0  # when neither the request nor the bundle's generation_config sets one


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


def _speculation(body: Any, config: ServeConfig) -> dict[str, Any]:
    spec = body.speculative
    method = (spec.method if spec else None) or config.method
    k = spec.num_speculative_tokens if spec and spec.num_speculative_tokens is not None \
        else config.num_speculative_tokens
    return {"method": method, "num_speculative_tokens": k}


def _constraint(body: Any, gen: Any) -> dict[str, Any]:
    """`response_format` -> {"constraint": ConstraintSpec} (or {}), compiled once here so that a schema the
    library cannot compile is a 400 before anything streams."""
    from specrt.runtime.constraint import ConstraintSpec

    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return {}
    try:
        if fmt.type == "json_object":
            spec = ConstraintSpec.json_object()
        else:
            if fmt.json_schema is None:
                raise bad_request("response_format of type 'json_schema' needs a 'json_schema' object with a "
                                  "'schema'", "response_format.json_schema")
            spec = ConstraintSpec.json_schema(fmt.json_schema.json_schema)
        gen.compile_constraint(spec)
    except InvalidArgument as exc:
        raise bad_request(str(exc), "response_format", code="invalid_response_format") from None
    return {"constraint": spec}


_PARAMS = {"method": "speculative.method", "num_speculative_tokens": "speculative.num_speculative_tokens"}
COMPLETION_MAX_LOGPROBS = 5  # OpenAI's limit on /v1/completions (chat: top_logprobs up to 20)


def _logits(body: Any, chat: bool) -> dict[str, Any]:
    """Penalties, logit_bias and logprobs -> GenerationRequest fields (ranges checked there)."""
    if chat:
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        n = (body.top_logprobs or 0) if body.logprobs else None
        if n is not None and not 0 <= n <= 20:
            raise bad_request(f"top_logprobs must be an integer in [0, 20], got {n}", "top_logprobs")
    else:
        n = body.logprobs
        if n is not None and not 0 <= n <= COMPLETION_MAX_LOGPROBS:
            raise bad_request(f"logprobs must be an integer in [0, {COMPLETION_MAX_LOGPROBS}], got {n}", "logprobs")
    fields = {name: getattr(body, name) for name in ("presence_penalty", "frequency_penalty", "repetition_penalty",
                                                     "logit_bias") if getattr(body, name) is not None}
    return {**fields, "logprobs": n}


def _request(body: Any, gen: Any, config: ServeConfig, max_tokens: int, chat: bool) -> GenerationRequest:
    """The typed request (runtime/request.py): one validation; omitted sampling fields from the bundle's
    generation_config, else OpenAI's defaults (temperature 1, top_p 1)."""
    try:
        req = GenerationRequest(max_new_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                top_k=body.top_k, seed=body.seed, stop=() if body.stop is None else body.stop,
                                **_speculation(body, config), **_constraint(body, gen), **_logits(body, chat))
        req = req.with_defaults(gen.sampling_defaults, fallback_temperature=OPENAI_TEMPERATURE)
        req.check_for(gen.max_draft_tokens, gen.methods)
        req.logits_params.check_vocab(gen.vocab_size)
    except InvalidArgument as exc:  # RequestFieldError, or the vocabulary check of logit_bias: both name a field
        field = getattr(exc, "field", None)
        raise bad_request(str(exc), _PARAMS.get(field, field)) from None
    return req


def _job(body: Any, gen: Any, config: ServeConfig, prompt_ids: list[int], max_tokens: Optional[int],
         default_max_tokens: int, chat: bool) -> Prepared:
    check_unsupported(body)
    check_text(body.stop, "stop")
    if body.n != 1:
        raise bad_request(f"n={body.n} is not supported: this server returns exactly one choice (n=1)", "n")
    if body.model is not None and body.model != config.served_model_name:
        raise APIError(400, f"unknown model {body.model!r}; this server serves {config.served_model_name!r}",
                       param="model", code="model_not_found")
    context = gen.max_seq_len
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif max_tokens < 1:
        raise bad_request(f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    if len(prompt_ids) + max_tokens > context:
        raise bad_request(f"this model's maximum context length is {context} tokens, but {len(prompt_ids)} prompt "
                          f"tokens + max_tokens={max_tokens} = {len(prompt_ids) + max_tokens}; lower max_tokens "
                          "or shorten the prompt", "max_tokens", code="context_length_exceeded")
    job = Job(prompt_ids, _request(body, gen, config, max_tokens, chat))
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
    for i, m in enumerate(body.messages):  # as OpenAI: a known role, and content (tool calls are not served)
        if m.role not in CHAT_ROLES:
            raise bad_request(f"messages.{i}.role {m.role!r:.40} is not one of {', '.join(CHAT_ROLES)}",
                              f"messages.{i}.role")
        if m.content is None:
            raise bad_request(f"messages.{i} has no content (a string or a list of text parts)",
                              f"messages.{i}.content")
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    for i, m in enumerate(messages):
        check_text([m["role"], m["content"]], f"messages.{i}")
    try:
        text, add_special = formatter.render(messages)
    except InvalidArgument as exc:
        raise bad_request(str(exc), "messages") from None
    ids = _encode(gen, text, add_special)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return _job(body, gen, config, ids, max_tokens, gen.max_seq_len - len(ids), chat=True)
