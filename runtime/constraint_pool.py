"""Where native constraint compilers run: a few threads with large stacks, each compile bounded in time, and
what they produced, kept for the next request with the same constraint.

    matcher = COMPILE_POOL.run(build)      # on a compile thread; CompileTimeout / CompilerBusy past the limits

* Threads: `THREADS` per process, whatever asks (CLI, Python API, server), so compiles never take the pools
  that serve plain requests. Their stack is `STACK_BYTES` (virtual memory; pages are used as touched), so the
  schema bounds of runtime/constraint_limits.py sit ~64x below what overflows it.
* Time: a compile running longer than `COMPILE_SECONDS` is answered with CompileTimeout; llguidance cannot be
  interrupted, so its thread finishes it in the background (llguidance's own limits bound that work) and is
  busy meanwhile. A compile that waits longer than `WAIT_SECONDS` for a free thread gets CompilerBusy.
* Cache: `CompiledCache` keeps the last `CACHE_ENTRIES` compiled matchers per (tokenizer, constraint); a request
  gets a copy (llguidance's `deep_copy`, ~30 us), so a schema sent with every request compiles once.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future
from typing import Any, Callable, Hashable, Optional

from specrt.runtime.constraint_limits import ConstraintLimitError

THREADS = 2
STACK_BYTES = 256 << 20
COMPILE_SECONDS = 10.0
WAIT_SECONDS = 30.0
CACHE_ENTRIES = 16


class CompileTimeout(ConstraintLimitError):
    """The compile ran past COMPILE_SECONDS."""


class CompilerBusy(ConstraintLimitError):
    """No compile thread was free within WAIT_SECONDS (earlier compiles still running): retry later."""


class _Task:
    def __init__(self, fn: Callable[[], Any], what: str) -> None:
        self.fn, self.what = fn, what
        self.future: Future = Future()
        self.started = False


class CompilePool:
    def __init__(self, threads: int = THREADS, stack_bytes: int = STACK_BYTES, seconds: float = COMPILE_SECONDS,
                 wait_seconds: float = WAIT_SECONDS) -> None:
        self.threads, self.stack_bytes, self.seconds, self.wait_seconds = threads, stack_bytes, seconds, wait_seconds
        self._lock = threading.Lock()
        self._tasks: collections.deque[_Task] = collections.deque()
        self._ready = threading.Condition(self._lock)
        self._started = False
        self.running = 0  # compiles running now (abandoned ones included)

    def _start(self) -> None:
        started = 0
        for size in (self.stack_bytes, self.stack_bytes // 4, 0):  # smaller where address space is limited
            old = threading.stack_size(size)  # applies to threads started from now on, process-wide: restored
            try:  # at once (another thread started meanwhile only gets a larger stack)
                while started < self.threads:
                    threading.Thread(target=self._work, name=f"specrt-compile-{started}", daemon=True).start()
                    started += 1
                break
            except RuntimeError:  # "can't start new thread": no room for that stack
                continue
            finally:
                threading.stack_size(old)
        self.stack_used = size
        self._started = True

    def submit(self, fn: Callable[[], Any], what: str = "constraint") -> Future:
        """A Future of fn() run on a compile thread, failed with CompilerBusy / CompileTimeout past the limits."""
        task = _Task(fn, what)
        with self._lock:
            if not self._started:
                self._start()
            self._tasks.append(task)
            self._ready.notify()
        timer = threading.Timer(self.wait_seconds, self._expire_wait, (task,))
        timer.daemon = True
        timer.start()
        task.future.add_done_callback(lambda _: timer.cancel())
        return task.future

    def run(self, fn: Callable[[], Any], what: str = "constraint") -> Any:
        return self.submit(fn, what).result()

    def _expire_wait(self, task: _Task) -> None:
        with self._lock:
            if task.started or task.future.done():
                return
            self._tasks.remove(task)
        _settle(task.future, exc=CompilerBusy(f"the {task.what} compiler is busy (no compile thread free for "
                                              f"{self.wait_seconds:g} s); retry later"))

    def _expire_run(self, task: _Task) -> None:
        _settle(task.future, exc=CompileTimeout(f"compiling the {task.what} took longer than {self.seconds:g} s "
                                                "(the limit); make it smaller or simpler"))

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._tasks:
                    self._ready.wait()
                task = self._tasks.popleft()
                task.started = True
                self.running += 1
            timer = threading.Timer(self.seconds, self._expire_run, (task,))
            timer.daemon = True
            timer.start()
            try:
                result = task.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                _settle(task.future, exc=exc)
            else:
                _settle(task.future, result=result)
            finally:
                timer.cancel()
                with self._lock:
                    self.running -= 1


def _settle(future: Future, result: Any = None, exc: Optional[BaseException] = None) -> None:
    """Set a Future's outcome unless a limit already did (then the late result is dropped)."""
    with _SETTLE:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)


_SETTLE = threading.Lock()


class CompiledCache:
    """The last `entries` compiled matchers by key (least recently used dropped first); thread-safe."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self._items: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            return None

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)


COMPILE_POOL = CompilePool()
COMPILED = CompiledCache()
TOKENIZERS = CompiledCache(4)  # llguidance's tokenizer per (tokenizer.json digest, vocabulary size, EOS ids)
