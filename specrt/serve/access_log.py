"""One log line per request at the default level (INFO), written when the response is complete:

    INFO:     POST /v1/completions 200 12 tokens 0.35s

method, path, status, completion tokens (generation endpoints; set by the service in the request's state)
and wall-clock duration. Replaces uvicorn's access log, which has neither tokens nor duration.
"""

from __future__ import annotations

import logging
import sys
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOGGER = "specrt.serve"


def configure(level: str) -> None:
    """Print the specrt.serve logger like uvicorn prints its own lines."""
    log = logging.getLogger(LOGGER)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.log = logging.getLogger(LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        status = [0]

        async def logging_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, logging_send)
        finally:
            tokens = state.get("completion_tokens")
            self.log.info("%s %s %s%s %.2fs", scope["method"], scope["path"], status[0] or "-",
                          f" {tokens} tokens" if tokens is not None else "", time.perf_counter() - started)
