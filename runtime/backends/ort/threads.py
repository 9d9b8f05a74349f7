"""One ONNX Runtime thread pool for every CPU session of the process (opt-in: the batch engine's processes).

Why: sessions with pools of their own that take turns on the same cores spin against each other (2x slower right
after a switch); on one pool switching is free (measurements: docs/batching.md, "Limits", one thread pool).

The global pools are a property of ONNX Runtime's process-wide environment: once they exist, ONNX Runtime refuses
any session of that process that asks for a pool of its own ("use_per_session_threads must be false when using a
global thread pool"), whoever creates it. So specrt never turns them on by itself in a library call: the processes
that own all their sessions do (`specrt serve` with batching, `specrt bench --concurrency`), and a Python caller
may (`share_thread_pool()` before `load`). Once on, every session specrt creates (`session_options`) uses it;
its size is fixed for the process. SPECRT_SHARED_POOL=0 keeps per-session pools.
"""

from __future__ import annotations

import os

from specrt.runtime.backends.ort.environment import default_threads, import_ort

_POOL: int | None = None  # threads of the process's shared pool, once turned on


def share_thread_pool(threads: int | None = None) -> bool:
    """Run every ONNX Runtime CPU session specrt creates from now on, in this process, on one intra-op pool of
    `threads` threads (default: all cores). Call it before `load`. Returns whether the pool is shared (False when
    SPECRT_SHARED_POOL=0). A second call keeps the first size."""
    global _POOL
    if _POOL is not None:
        return True
    if os.environ.get("SPECRT_SHARED_POOL", "1") == "0":
        return False
    ort = import_ort()
    n = threads or default_threads()
    ort.set_global_thread_pool_sizes(n, 1)
    _POOL = n
    return True


def shared_pool() -> int | None:
    """The shared pool's size, or None while every session has a pool of its own."""
    return _POOL


def on_shared_pool(opts) -> bool:
    """Put a session (its SessionOptions) on the process's shared pool when there is one; returns whether it did
    (then the session must not be given threads or spinning settings of its own)."""
    if _POOL is None:
        return False
    opts.use_per_session_threads = False
    return True
