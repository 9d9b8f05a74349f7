"""One generation at a time per Generator, and no caller waiting on a reader that went away.

A Generator's runners hold one sequence's KV cache, so its generations run one at a time (`GenerationLock`). A
stream keeps the Generator while it is open; what happens when another call needs it while the stream's reader is
not reading (a half-read `stream()` left open, in this thread or another):

* the caller does not wait for the reader: it runs the stream's remaining steps itself, into the stream's buffer
  (`Steps.run_out`), then takes the Generator. The waiting is bounded by the stream's own `max_new_tokens`,
  never by its reader, and the stream's output is unchanged: its reader reads the rest from the buffer (an error
  of those steps reaches the reader, not the caller). A Hugging Face `TextIteratorStreamer` behaves alike: the
  generation runs to its end whether the streamer is read or not.
* a reader that is reading (it came back within `RUN_OUT_AFTER_S`) keeps streaming: the caller waits for its end.
* a stream that is closed, or dropped (garbage-collected), ends its generation at once.
* a call made from inside a step (an `on_step` hook calling `generate`) is an error, not a deadlock.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import weakref
from typing import Any, Iterator

from specrt.core.errors import InvalidArgument

RUN_OUT_AFTER_S = 0.1  # a stream not read for this long is run to its end by a caller that needs the Generator
POLL_S = 0.02


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Steps:
    """A generation's steps as its reader iterates them; `run_out` lets another caller finish them meanwhile."""

    def __init__(self) -> None:
        self.it: Iterator[Any] | None = None  # the generation (set by the Generator right after construction)
        self.buffer: collections.deque = collections.deque()  # steps run out for the reader, not read yet
        self.mutex = threading.Lock()  # held while a step runs (by the reader or by a caller running it out)
        self.ended = False
        self.away_since: float | None = None  # when the reader last got a step (None: it is inside a step)
        self.reader: int | None = None  # the thread inside a step now, None between steps
        self.last_reader: int | None = None

    def __iter__(self) -> "Steps":
        return self

    def __next__(self) -> Any:
        with self.mutex:
            self.away_since, self.reader = None, threading.get_ident()
            try:
                if self.buffer:
                    item = self.buffer.popleft()
                    if isinstance(item, _Raised):
                        raise item.exc
                    return item
                if self.ended:
                    raise StopIteration
                try:
                    return next(self.it)
                except StopIteration:
                    self.ended = True
                    raise
            finally:
                self.away_since, self.last_reader, self.reader = time.monotonic(), self.reader, None

    def close(self) -> None:
        with self.mutex:
            self.buffer.clear()
            self.ended = True
            if self.it is not None:
                self.it.close()  # the generation's `finally` releases the Generator

    def run_out(self) -> bool:
        """Run the remaining steps into the buffer (the generation ends, releasing the Generator). False when a
        step is running now (its reader is inside one): try again later."""
        if not self.mutex.acquire(blocking=False):
            return False
        try:
            if not self.ended:
                try:
                    for item in self.it:
                        self.buffer.append(item)
                except BaseException as exc:  # noqa: BLE001 - the stream's error is its reader's, raised on read
                    self.buffer.append(_Raised(exc))
                self.ended = True
        finally:
            self.mutex.release()
        return True


class GenerationLock:
    """The Generator's one-generation-at-a-time lock (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: weakref.ref | None = None  # its Steps (weak: dropping a stream must end it)

    @contextlib.contextmanager
    def hold(self, steps: "weakref.ref | None" = None):
        me = threading.get_ident()
        while not self._lock.acquire(timeout=POLL_S):
            holder = self._holder() if self._holder is not None else None
            if holder is None:
                continue
            if holder.reader == me:  # called from inside one of its steps (an on_step hook): waiting would deadlock
                raise InvalidArgument("this Generator is busy with a generation step in this same thread (a call "
                                      "from inside a step, e.g. an on_step hook): make the call after the step")
            away = holder.away_since
            if away is not None and (holder.last_reader == me or time.monotonic() - away > RUN_OUT_AFTER_S):
                holder.run_out()  # its reader is away (in this thread: it cannot be reading now)
        try:
            self._holder = steps
            yield
        finally:
            self._holder = None
            self._lock.release()
