"""The server's one admission queue (`AdmissionQueue`) and each request's async stream of events (`RequestStream`).

    pool = AdmissionQueue(slots, max_queue=64)   # slots: the generators, or the batch's slot numbers
    slot = await pool.acquire()       # waits in FIFO order; raises QueueFull beyond max_queue waiters
    pool.admit(); ...; pool.unadmit(); slot = await pool.acquire(admitted=True)   # work before the slot (a compile)
    stream = RequestStream(lambda: pool.release(slot))  # fed by a producer thread (engine_stream.py)
    async for event in stream: ...    # Delta / Done events, handed over with call_soon_threadsafe
    stream.cancel()                   # the producer stops between two steps; the slot is then released
    pool.close(err); stream.fail(err) # shutdown: no more slots (waiters get err); the stream ends with err

A slot is a generator (one generation at a time each, in a worker thread) or, with `--max-batch N`, one of the N
rows of the engine's batch: the engine admits a request the moment it is queued, so this is the only queue a
request waits in. A slot goes back when the producer has finished with it (not when the client leaves), so a
generator is never driven by two threads and a batch never holds more than N requests; it is back before the
response ends, so a client that sends its next request right after an answer never finds its own slot still taken.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from specrt.serve.worker import Done


class QueueFull(Exception):
    """Every slot is busy and max_queue requests already wait."""


class ServerShuttingDown(Exception):
    """The server's graceful shutdown has run out of time: what still runs or waits ends with this (a 503)."""


class AdmissionQueue:
    def __init__(self, slots: Sequence[Any], max_queue: int) -> None:
        if not slots:
            raise ValueError("an admission queue needs at least one slot")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.slots = list(slots)
        self.max_queue = max_queue
        self.waiting = 0  # requests waiting for a slot
        self.admitted = 0  # admitted, not yet waiting (compiling their response_format): each holds a queue place
        self._free: asyncio.Queue | None = None  # created on the serving loop
        self.closed: Optional[ServerShuttingDown] = None  # `close`: no slot is handed out any more

    @property
    def size(self) -> int:
        return len(self.slots)

    @property
    def free(self) -> int:
        return self._free.qsize() if self._free is not None else self.size

    @property
    def busy(self) -> int:
        return self.size - self.free

    def _queue(self) -> asyncio.Queue:
        if self._free is None:
            self._free = asyncio.Queue()
            for slot in self.slots:
                self._free.put_nowait(slot)
        return self._free

    def admit(self) -> None:
        """Take a place for a request that has work to do before it needs a slot (release with `unadmit`, then
        `acquire(admitted=True)`): QueueFull when no slot and no queue place is left for it."""
        if self.closed is not None:
            raise self.closed
        free = self._queue().qsize() - self.waiting - self.admitted  # slots nobody is waiting for
        if free <= 0 and self.waiting + self.admitted >= self.max_queue:
            raise QueueFull(f"all {self.size} slots are busy and {self.waiting + self.admitted} requests are waiting")
        self.admitted += 1

    def unadmit(self) -> None:
        self.admitted -= 1

    async def acquire(self, admitted: bool = False) -> Any:
        """A free slot, in FIFO order; QueueFull beyond max_queue waiters (not for an `admitted` request: its place
        was taken by `admit`)."""
        free = self._queue()
        if self.closed is not None:
            raise self.closed
        if self.waiting == 0 and not free.empty():
            return free.get_nowait()
        if not admitted and self.waiting + self.admitted >= self.max_queue:
            raise QueueFull(f"all {self.size} slots are busy and {self.waiting + self.admitted} requests are waiting")
        self.waiting += 1
        try:
            slot = await free.get()
        finally:
            self.waiting -= 1
        if self.closed is not None:  # closed while waiting: the slot goes on to the next waiter, who leaves too
            free.put_nowait(slot)
            raise self.closed
        return slot

    def release(self, slot: Any) -> None:
        self._queue().put_nowait(slot)

    def close(self, error: ServerShuttingDown) -> None:
        """Hand out no more slots: waiting requests (as the slots come back) and later ones get `error`."""
        self.closed = error


class RequestStream:
    """One generation's events on the serving loop (Delta..., then one Done), whichever thread produces them: the
    producer calls `emit`; `release` (the slot's return) runs once, on the loop, before Done is delivered."""

    def __init__(self, release: Callable[[], None], observe: Optional[Callable[[Any], None]] = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.done = False
        self.finished = False  # the producer's Done event has arrived on the loop (read or not)
        self.stop: Callable[[], None] = lambda: None  # set by the producer: stop between two steps (any thread)
        self._observe = observe
        self._release: Optional[Callable[[], None]] = release
        self.failed: Optional[BaseException] = None  # `fail`: reported instead of the "cancelled" end

    def release(self) -> None:  # on the loop; once
        if self._release is not None:
            release, self._release = self._release, None
            release()

    def cancel(self) -> None:
        """The client left: stop the generation (its slot is released when the producer has stopped)."""
        if not self.finished:
            self.stop()

    def fail(self, error: BaseException) -> None:
        """Stop the generation for `error` (the server shuts down): it ends with that error, not as cancelled."""
        if not self.finished:
            self.failed = error
            self.stop()

    def emit(self, event: Any) -> None:  # from the producer's thread
        try:
            self.loop.call_soon_threadsafe(self.deliver, event)
        except RuntimeError:  # the loop is closed (server shut down): nobody listens any more
            self.stop()

    def deliver(self, event: Any) -> None:  # on the loop: metrics see every event, read or not
        if isinstance(event, Done):  # the slot is idle again: free it before answering
            if self.failed is not None and event.finish_reason == "cancelled":
                event = Done("error", event.completion_tokens, event.stats, self.failed)
            self.finished = True
            self.release()
        if self._observe is not None:
            self._observe(event)
        self.events.put_nowait(event)

    async def next_event(self) -> Any:
        event = await self.events.get()
        if isinstance(event, Done):
            self.done = True
        return event

    async def __aiter__(self) -> AsyncIterator[Any]:
        while not self.done:
            yield await self.next_event()
