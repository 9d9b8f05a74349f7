"""Request bodies of the OpenAI-compatible endpoints (pydantic, strict types: "5" is not an integer).

Unknown OpenAI fields (`user`, `metadata`, ...) are ignored, as vLLM does; fields that would change the
output but are not implemented (`echo`, `best_of`, tools) get a 400 (guards.py). The one extension is
`speculative` (vLLM-style extra body field; the openai client sends it with `extra_body=`):

    {"speculative": {"method": "draft" | "ngram" | "hybrid" | ..., "num_speculative_tokens": 5 | "auto",
                     "auto_sources": "ngram,recycle" | "-head" | [...]}}   (method auto's sources, docs/drafting.md)

The methods a request may name are the ones the served bundle runs (`request_models`, the list /v1/models
advertises as `speculative_methods`): the app's request schema (and /openapi.json) is built from them.

Structured output: `response_format` as OpenAI defines it, `{"type": "text"}`, `{"type": "json_object"}` or
`{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true}}` (the output is
constrained to the schema whether `strict` is true or not; a schema the library cannot compile is a 400).

Ranges that depend on the bundle (context length, compiled maximum k, methods) are checked in
`service.py`, where the bundle is known.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, create_model

from specrt.runtime.request import METHODS

Number = Union[StrictInt, StrictFloat]
Stop = Union[StrictStr, list[StrictStr], None]


class SpeculativeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: Optional[Literal[METHODS]] = None  # narrowed to the served bundle's methods by `request_models`
    num_speculative_tokens: Union[StrictInt, Literal["auto"], None] = None
    auto_sources: Union[StrictStr, list[StrictStr], None] = None  # method auto's ("ngram,recycle", "-head"; None: all)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Optional[StrictStr] = None
    description: Optional[StrictStr] = None
    json_schema: Union[dict[str, Any], StrictBool] = Field(alias="schema")
    strict: Optional[StrictBool] = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions. Extra fields are kept (not used) so that
    guards.check_unsupported can refuse those that would change the output."""

    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    max_tokens: Optional[StrictInt] = None
    temperature: Optional[Number] = None  # None -> 1.0, as OpenAI
    top_p: Optional[Number] = None  # None -> 1.0
    top_k: Optional[StrictInt] = None  # vLLM extension; 0 or None = off
    min_p: Optional[Number] = None  # vLLM extension, [0, 1]; 0 or None = off
    seed: Optional[StrictInt] = None
    stop: Stop = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    speculative: Optional[SpeculativeOptions] = None
    response_format: Optional[ResponseFormat] = None
    presence_penalty: Optional[Number] = None  # OpenAI, [-2, 2]
    frequency_penalty: Optional[Number] = None  # OpenAI, [-2, 2]
    repetition_penalty: Optional[Number] = None  # vLLM extension, (0, 2]
    logit_bias: Optional[dict[str, Number]] = None  # token id (a string, as JSON keys) -> [-100, 100]
    stop_token_ids: Optional[list[StrictInt]] = None  # vLLM extension: ids that end the output as EOS does
    ignore_eos: Optional[StrictBool] = None  # vLLM extension: the model's EOS does not end the output


class CompletionRequest(SamplingFields):
    logprobs: Optional[StrictInt] = None  # [0, 5]: the top N alternatives of each token
    # a string, a list of strings, token ids, or a list of token-id lists (several prompts: one choice each)
    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: StrictStr
    content: Union[StrictStr, list[TextPart], None] = None
    tool_calls: Optional[list[dict[str, Any]]] = None  # an assistant's calls (checked in tool_format.py)
    tool_call_id: Optional[StrictStr] = None  # role "tool": the call it answers
    name: Optional[StrictStr] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[StrictInt] = None  # newer OpenAI name of max_tokens
    logprobs: Optional[StrictBool] = None
    top_logprobs: Optional[StrictInt] = None  # [0, 20], with logprobs true
    chat_template_kwargs: Optional[dict[StrictStr, Any]] = None  # vLLM extension: more template variables


def request_models(methods: Sequence[str]) -> tuple[type[CompletionRequest], type[ChatRequest]]:
    """(completion, chat) request models whose `speculative.method` takes exactly `methods`: what the served bundle
    runs in this server's mode (the list /v1/models advertises), so a method is advertised iff it is accepted."""
    spec = create_model("SpeculativeOptions", __base__=SpeculativeOptions,
                        method=(Optional[Literal[tuple(methods)]], None))
    fields: dict[str, Any] = {"speculative": (Optional[spec], None)}
    return (create_model("CompletionRequest", __base__=CompletionRequest, **fields),
            create_model("ChatRequest", __base__=ChatRequest, **fields))
