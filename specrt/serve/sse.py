"""Server-sent events in the OpenAI format: `data: {json}\n\n` per chunk, then `data: [DONE]\n\n`.

`EventStream` is a StreamingResponse that runs `on_close` however the response ends (finished, client
gone, server shutting down): the service uses it to cancel the generation of a departed client.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class EventStream(StreamingResponse):
    def __init__(self, content: Any, on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=HEADERS)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
