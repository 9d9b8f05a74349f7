"""Validate a parsed request against the bundle and turn it into a `Job` (runs in a worker thread).

Every check names the field (`param`) and the bad value; nothing here touches a model runner. The request is
resolved once (`Generator.request`) and each prompt prepared once (runtime/prepared.py): a Job carries its
`PreparedRequest`, which the slot's generator (or the batch engine) runs without checking it again.
Sampling fields a request omits come from the bundle's generation_config.json (as vLLM does), else
OpenAI's defaults: temperature 1, top_p 1; max_tokens 16 for completions and "the rest of the context" for chat.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any, Optional

from specrt.core.errors import InvalidArgument
from specrt.runtime.chat_template import ChatFormatter, check_variables
from specrt.serve.config import ServeConfig
from specrt.runtime.prepared import ContextExceeded, PreparedRequest, prepare_prompt
from specrt.runtime.request import MAX_CHOICES, GenerationRequest
from specrt.serve.errors import APIError, bad_request
from specrt.serve.guards import check_text, check_unsupported
from specrt.serve.choices import check_n, plan_jobs
from specrt.serve.tool_format import chat_messages, template_features
from specrt.serve.tools import parse_tools, tool_constraint
from specrt.serve.worker import Job

COMPLETION_DEFAULT_MAX_TOKENS = 16
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # developer: OpenAI's newer name of system
OPENAI_TEMPERATURE = 1.0  # when neither the request nor the bundle's generation_config sets one


@dataclasses.dataclass
class Prepared:
    job: Job
    chat: bool
    stream: bool
    include_usage: bool
    request_id: str
    created: int
    # several choices (choices.py): the jobs decoded, the job of each choice index, prompt tokens of all prompts
    jobs: list[Job] = dataclasses.field(default_factory=list)
    choice_jobs: list[int] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    tools: Any = None  # a tools.ToolPlan: the answer is parsed for tool calls
    n: int = 1  # choices per prompt: choice p * n is prompt p's first (its usage's cached_tokens)

    @property
    def several(self) -> bool:
        """Answered by choice_responses.py: several choices, or tool calls to parse."""
        return len(self.choice_jobs) > 1 or self.tools is not None


def _encode(gen: Any, prompt: Any, add_special_tokens: bool = True) -> list[int]:
    """A prompt's token ids as given or tokenized (text once); checked once, by `prepare_prompt` in `_job`."""
    if isinstance(prompt, str):
        return gen.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    return list(prompt)


def _prompts(gen: Any, prompt: Any) -> list[list[int]]:
    """One prompt or several (a list of strings or of token-id lists, as OpenAI accepts): their token ids."""
    check_text(prompt, "prompt")
    if isinstance(prompt, list):
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if isinstance(prompt[0], (str, list)):
            if len(prompt) > MAX_CHOICES:
                raise bad_request(f"at most {MAX_CHOICES} prompts per request, got {len(prompt)}", "prompt")
            for i, one in enumerate(prompt):
                if len(one) == 0:
                    raise bad_request(f"prompt {i} is empty" if len(prompt) > 1 else "prompt must not be empty",
                                      "prompt")
            return [_encode(gen, one) for one in prompt]
    if isinstance(prompt, (str, list)) and len(prompt) == 0:
        raise bad_request("prompt must not be empty", "prompt")
    return [_encode(gen, prompt)]


def _speculation(body: Any, config: ServeConfig) -> dict[str, Any]:
    spec = body.speculative
    method = (spec.method if spec else None) or config.method
    k = spec.num_speculative_tokens if spec and spec.num_speculative_tokens is not None \
        else config.num_speculative_tokens
    sources = spec.auto_sources if spec else None  # runtime/proposers/auto_sources.py
    return {"method": method, "num_speculative_tokens": k, **({"auto_sources": sources} if sources is not None else {})}


def _constraint(body: Any, gen: Any) -> dict[str, Any]:
    """`response_format` -> {"constraint": ConstraintSpec} (or {}), checked against the bounds of
    runtime/constraint_limits.py (size, nesting, depth through $ref): cheap, in Python, before admission. The
    compile itself comes after admission, on the compile threads (Service._compile)."""
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
    except InvalidArgument as exc:
        raise bad_request(str(exc), "response_format", code="invalid_response_format") from None
    return {"constraint": spec}


_PARAMS = {"method": "speculative.method", "num_speculative_tokens": "speculative.num_speculative_tokens",
           "auto_sources": "speculative.auto_sources"}
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


def _request(body: Any, gen: Any, config: ServeConfig, max_tokens: int, chat: bool,
             tool_spec: Any = None) -> GenerationRequest:
    """The typed request (runtime/request.py), resolved once by `Generator.request` (k, method); omitted sampling
    fields from the bundle's generation_config, else OpenAI's defaults (temperature 1, top_p 1). `strict`: a prompt
    + max_tokens beyond the context is refused (400), as OpenAI does."""
    try:
        req = GenerationRequest(max_new_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                top_k=body.top_k, min_p=body.min_p, seed=body.seed,
                                stop=() if body.stop is None else body.stop,
                                stop_token_ids=body.stop_token_ids or (), ignore_eos=bool(body.ignore_eos),
                                strict=True, **_speculation(body, config), **_logits(body, chat),
                                **({"constraint": tool_spec} if tool_spec is not None else _constraint(body, gen)))
        return gen.request("prepare", None, req.with_defaults(gen.sampling_defaults,
                                                              fallback_temperature=OPENAI_TEMPERATURE))
    except InvalidArgument as exc:  # RequestFieldError: names a field
        raise _field_error(exc) from None


def _field_error(exc: InvalidArgument) -> APIError:
    if isinstance(exc, ContextExceeded):
        total = exc.prompt_tokens + exc.max_new_tokens
        return bad_request(f"this model's maximum context length is {exc.context} tokens, but {exc.prompt_tokens} "
                           f"prompt tokens + max_tokens={exc.max_new_tokens} = {total}; lower max_tokens or shorten "
                           "the prompt", "max_tokens", code="context_length_exceeded")
    field = getattr(exc, "field", None)
    return bad_request(str(exc), _PARAMS.get(field, field))


def _prepare(gen: Any, prompts: list[list[int]], request: GenerationRequest) -> list[PreparedRequest]:
    """Each prompt prepared once (runtime/prepared.py: ids, context, penalties against the vocabulary). The
    constraint is compiled after admission, on the compile threads (Service._compile), and by the run."""
    try:
        return [prepare_prompt(gen, ids, request, compile_constraint=False) for ids in prompts]
    except InvalidArgument as exc:
        raise _field_error(exc) from None


def _job(body: Any, gen: Any, config: ServeConfig, prompts: list[list[int]], max_tokens: Optional[int],
         default_max_tokens: int, chat: bool, tools: Any = None) -> Prepared:
    check_unsupported(body)
    check_text(body.stop, "stop")
    n = check_n(body.n, len(prompts))
    if body.model is not None and body.model != config.served_model_name:
        raise APIError(400, f"unknown model {body.model!r}; this server serves {config.served_model_name!r}",
                       param="model", code="model_not_found")
    if max_tokens is None:
        max_tokens = max(default_max_tokens, 1)  # a prompt that fills the context: refused by _prepare
    elif max_tokens < 1:
        raise bad_request(f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    tool_spec = tool_constraint(tools, gen) if tools is not None else None
    request = _request(body, gen, config, max_tokens, chat, tool_spec)
    jobs, choice_jobs = plan_jobs(_prepare(gen, prompts, request), n)
    if body.stream_options is not None and not body.stream:  # as OpenAI and vLLM
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    return Prepared(jobs[0], chat, body.stream, include_usage, rid, int(time.time()), jobs, choice_jobs,
                    sum(len(p) for p in prompts), tools, n)


def prepare_completion(body: Any, gen: Any, config: ServeConfig) -> Prepared:
    refuse_tools(body)
    prompts = _prompts(gen, body.prompt)
    default = min(COMPLETION_DEFAULT_MAX_TOKENS, gen.max_seq_len - max(len(p) for p in prompts))
    return _job(body, gen, config, prompts, body.max_tokens, default, chat=False)


def prepare_chat(body: Any, gen: Any, config: ServeConfig, formatter: ChatFormatter) -> Prepared:
    if not body.messages:
        raise bad_request("messages must hold at least one message", "messages")
    for i, m in enumerate(body.messages):  # as OpenAI: a known role, and content (or an assistant's tool calls)
        if m.role not in CHAT_ROLES:
            raise bad_request(f"messages.{i}.role {m.role!r:.40} is not one of {', '.join(CHAT_ROLES)}",
                              f"messages.{i}.role")
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise bad_request(f"messages.{i} has no content (a string or a list of text parts)",
                              f"messages.{i}.content")
        if m.role == "tool" and m.tool_call_id is None:
            raise bad_request(f"messages.{i} (role 'tool') needs the tool_call_id it answers",
                              f"messages.{i}.tool_call_id")
    extra = body.model_extra or {}
    if extra.get("tools") and extra.get("tool_choice") != "none":
        formatter = formatter.with_tools()  # a checkpoint's separate tool_use template, as transformers picks it
    plan = parse_tools(extra, formatter)
    if plan is not None and plan.choice != "auto" and body.response_format is not None \
            and body.response_format.type != "text":
        raise bad_request("response_format cannot be combined with a forced tool call (tool_choice 'required' or "
                          "a named function): the call's arguments follow the function's parameters schema",
                          "response_format")
    features = template_features(formatter)
    messages = chat_messages(body.messages, plan, features)
    for i, m in enumerate(messages):
        check_text([m["role"], m["content"], json.dumps(m.get("tool_calls"), ensure_ascii=False)], f"messages.{i}")
    rendered_tools = plan.tools if plan is not None and "tools" in features else None
    if rendered_tools:
        check_text(json.dumps(rendered_tools, ensure_ascii=False), "tools")
    variables = body.chat_template_kwargs
    if variables:
        check_text(json.dumps(variables, ensure_ascii=False), "chat_template_kwargs")
        try:
            check_variables(variables)  # render's own rule, checked first to name the field
        except InvalidArgument as exc:
            raise bad_request(str(exc), "chat_template_kwargs") from None
    try:
        text, add_special = formatter.render(messages, tools=rendered_tools, variables=variables)
    except InvalidArgument as exc:
        raise bad_request(str(exc), "messages") from None
    ids = _encode(gen, text, add_special)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return _job(body, gen, config, [ids], max_tokens, gen.max_seq_len - len(ids), chat=True, tools=plan)


def refuse_tools(body: Any) -> None:
    """Tools belong to chat: /v1/completions refuses them (a completion has no tool-call format)."""
    extra = body.model_extra or {}
    for field in ("tools", "tool_choice", "parallel_tool_calls"):
        if extra.get(field) not in (None, [], "none"):
            raise bad_request(f"{field} is only served on /v1/chat/completions (a completion has no tool calls)",
                              field, code="unsupported_parameter")
