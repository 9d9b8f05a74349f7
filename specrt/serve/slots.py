"""Slots: N generators (one generation at a time each), a bounded wait queue, and cancellable runs.

    pool = SlotPool(generators, max_queue=64)
    gen = await pool.acquire()        # waits in FIFO order; raises QueueFull beyond max_queue waiters
    pool.admit(); ...; pool.unadmit(); gen = await pool.acquire(admitted=True)   # work before the slot (a compile)
    run = Run(pool, gen, job, executor)   # the model work runs in a worker thread, never on the loop
    async for event in run: ...       # Delta / Done events, handed over with call_soon_threadsafe
    run.cancel.set()                  # the worker stops between two steps; its slot is then released

A slot goes back to the pool when its worker has finished with the generator (not when the client
leaves), so a generator is never driven by two threads; it is back before the response ends, so a
client that sends its next request right after an answer never finds its own slot still taken.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Executor
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from specrt.serve.worker import Done, Job, run_job


class QueueFull(Exception):
    """Every slot is busy and max_queue requests already wait."""


class SlotPool:
    def __init__(self, generators: Sequence[Any], max_queue: int) -> None:
        if not generators:
            raise ValueError("a slot pool needs at least one generator")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.generators = list(generators)
        self.max_queue = max_queue
        self.waiting = 0  # requests waiting for a slot
        self.admitted = 0  # admitted, not yet waiting (compiling their response_format): each holds a queue place
        self._free: asyncio.Queue | None = None  # created on the serving loop

    @property
    def size(self) -> int:
        return len(self.generators)

    @property
    def free(self) -> int:
        return self._free.qsize() if self._free is not None else self.size

    @property
    def busy(self) -> int:
        return self.size - self.free

    def _queue(self) -> asyncio.Queue:
        if self._free is None:
            self._free = asyncio.Queue()
            for gen in self.generators:
                self._free.put_nowait(gen)
        return self._free

    def admit(self) -> None:
        """Take a place for a request that has work to do before it needs a slot (release with `unadmit`, then
        `acquire(admitted=True)`): QueueFull when no slot and no queue place is left for it."""
        free = self._queue().qsize() - self.waiting - self.admitted  # slots nobody is waiting for
        if free <= 0 and self.waiting + self.admitted >= self.max_queue:
            raise QueueFull(f"all {self.size} slots are busy and {self.waiting + self.admitted} requests are waiting")
        self.admitted += 1

    def unadmit(self) -> None:
        self.admitted -= 1

    async def acquire(self, admitted: bool = False) -> Any:
        """A free generator, in FIFO order; QueueFull beyond max_queue waiters (not for an `admitted` request:
        its place was taken by `admit`)."""
        free = self._queue()
        if self.waiting == 0 and not free.empty():
            return free.get_nowait()
        if not admitted and self.waiting + self.admitted >= self.max_queue:
            raise QueueFull(f"all {self.size} slots are busy and {self.waiting + self.admitted} requests are waiting")
        self.waiting += 1
        try:
            return await free.get()
        finally:
            self.waiting -= 1

    def release(self, gen: Any) -> None:
        self._queue().put_nowait(gen)


class Run:
    """One generation on one slot, in a worker thread; iterate it for events."""

    def __init__(self, pool: SlotPool, gen: Any, job: Job, executor: Executor,
                 observe: Optional[Callable[[Any], None]] = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.cancel = threading.Event()
        self.events: asyncio.Queue = asyncio.Queue()
        self.done = False
        self.finished = False  # the worker's Done event has arrived on the loop (read or not)
        self._observe = observe
        self._pool, self._gen = pool, gen
        self.future = self.loop.run_in_executor(executor, run_job, gen, job, self.cancel, self._emit)
        self.future.add_done_callback(lambda _: self._release())  # in case run_job died before Done

    def _release(self) -> None:
        if self._gen is not None:
            self._pool.release(self._gen)
            self._gen = None

    def _emit(self, event: Any) -> None:  # called from the worker thread
        try:
            if isinstance(event, Done):  # the generator is idle again: free the slot before answering
                self.loop.call_soon_threadsafe(self._release)
            self.loop.call_soon_threadsafe(self._deliver, event)
        except RuntimeError:  # the loop is closed (server shut down): nobody listens any more
            self.cancel.set()

    def _deliver(self, event: Any) -> None:  # on the loop: metrics see every event, read or not
        self.finished = self.finished or isinstance(event, Done)
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
