"""Request guards (issue 10): values that change results must be supported or refused; text must be valid
Unicode; an unexpected failure becomes a 500 that keeps the connection usable.

* `check_unsupported(body)`: OpenAI fields that would change the output (`echo`, `best_of`, tools, ...) get a 400 naming the field instead of being silently ignored.
* `check_text(value, param)`: a lone surrogate (JSON `"\\ud800"`) is not encodable text: 400.
* `CatchAll`: innermost middleware; logs an unexpected exception once and answers 500 without re-raising
  (Starlette's handler for `Exception` re-raises, which makes uvicorn drop the keep-alive connection).
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specrt.serve.errors import bad_request

log = logging.getLogger("specrt.serve")

# field -> the value(s) that are harmless (the OpenAI default); anything else changes results
UNSUPPORTED = {
    "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
    # OpenAI's legacy function calling (tools / tool_choice are served: serve/tools.py)
    "functions": (None, []), "function_call": (None, "none"),
    "min_tokens": (None, 0), "prediction": (None,),
    # vLLM's sampling extensions this server does not implement (ignore_eos and stop_token_ids it serves)
    "bad_words": (None, []),
    "allowed_token_ids": (None,), "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
    "use_beam_search": (None, False), "prompt_logprobs": (None,), "truncate_prompt_tokens": (None,),
    "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    # outputs this server cannot produce (audio, web search)
    "audio": (None,), "modalities": (None, ["text"]), "web_search_options": (None,),
}


def check_unsupported(body: Any) -> None:
    extra = getattr(body, "model_extra", None) or {}
    for field, harmless in UNSUPPORTED.items():
        value = extra.get(field)
        if value is not None and not any(value == h and type(value) is type(h) for h in harmless):
            raise bad_request(f"{field} is not supported by this server (it would change the output; got "
                              f"{_describe(value)}): leave {field} out", field, code="unsupported_parameter")


def _describe(value: Any, limit: int = 60) -> str:
    """The value whole when its repr is short, else what it is (a repr cut mid-way read as a broken message)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, (list, tuple, dict)):
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"a {type(value).__name__} of {len(text)} characters"


def check_text(value: Any, param: str) -> None:
    """Raise a 400 if any string in `value` (str, list, nested) is not encodable as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise bad_request(f"{param} holds a lone surrogate ({value[exc.start]!r}) at index {exc.start}: "
                              "not valid Unicode text", param) from None
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_text(item, param)


class CatchAll:
    """500 JSON for an unexpected exception, logged once; the connection stays open for the next request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 - the point of this middleware
            log.error("internal error on %s: %s: %s", scope.get("path"), type(exc).__name__, exc, exc_info=exc)
            if started:
                return  # a streamed response already began: nothing more can be said in HTTP
            from specrt.serve.middleware import send_error

            await send_error(send, 500, f"internal server error: {type(exc).__name__}", "server_error",
                             type="server_error")
