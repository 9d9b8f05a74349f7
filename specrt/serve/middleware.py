"""Pure ASGI middleware: request metrics, API-key check, body-size limit (outermost first).

They answer before the body is read or the route runs, so a 401 or 413 costs no parsing.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specrt.serve.errors import error_body

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


async def send_error(send: Send, status: int, message: str, code: str,
                     headers: Optional[list[tuple[bytes, bytes]]] = None,
                     type: str = "invalid_request_error") -> None:
    body = json.dumps(error_body(message, type=type, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())] + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class RequestMetrics:
    """Count every response by endpoint and status (unknown paths are counted as 'other')."""

    def __init__(self, app: ASGIApp, metrics: Any) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"].rstrip("/") or "/"
        endpoint = path if path in ENDPOINTS else "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


class ApiKeyAuth:
    """`Authorization: Bearer KEY` on /v1/*; /health and /metrics stay open (as in vLLM)."""

    def __init__(self, app: ASGIApp, api_key: Optional[str]) -> None:
        self.app, self.api_key = app, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.api_key and scope["path"].startswith("/v1"):
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"")  # raw bytes: a non-ASCII key is compared as UTF-8
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(),
                                                                         self.api_key.encode("utf-8")):
                what = "missing API key" if not auth else "incorrect API key"
                return await send_error(send, 401, f"{what}: send 'Authorization: Bearer <key>'",
                                        "invalid_api_key", [(b"www-authenticate", b"Bearer")])
        await self.app(scope, receive, send)


class BodyLimit:
    """413 when Content-Length or the bytes actually sent exceed `max_bytes`; the body is then replayed."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_large = f"request body is larger than the limit of {self.max_bytes} bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await send_error(send, 413, too_large, "request_too_large")
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            try:  # a body shorter than its Content-Length must not hold the connection forever
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                return await send_error(send, 408, f"the request body did not arrive within {self.timeout_s:g} s",
                                        "request_timeout", [(b"connection", b"close")])
            if message["type"] != "http.request":  # the client left before sending the body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await send_error(send, 413, too_large, "request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
