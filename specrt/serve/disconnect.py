"""A client that leaves: waiting for its disconnect while a response is collected (plain or several choices)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request


async def wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect_or_gone(request: Request, collect: Any, stop: Any) -> tuple[bool, Any]:
    """(True, what `collect` (a coroutine) returns), or (False, None) when the client left first: then `stop()`
    (stop generating for nobody)."""
    task = asyncio.ensure_future(collect)
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        stop()
        task.cancel()
        return False, None
    return True, task.result()
