"""Cold start: other loading work while ONNX Runtime initializes a session.

Creating a session spends most of its time in `initialize_session` (graph optimisation, pre-packing the
weights), a C++ call that releases the GIL. Loading the tokenizer (`tokenizers.Tokenizer.from_file`, ~0.1 s for a
49k-token BPE) holds the GIL throughout. So the two overlap only when the session's thread is already inside
`initialize_session` when the tokenizer starts: started the other way round, the session's thread waits for the
GIL until the tokenizer is done and nothing is gained. `alongside` starts the session in a thread, waits until
that thread calls `initialize_session` (seen with a per-thread profile hook on C calls), and only then runs the
GIL-holding work here. SmolLM2 int4 on 2 cores: docs/first-run.md.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")
U = TypeVar("U")

GIL_FREE_CALL = "initialize_session"  # the ONNX Runtime binding's C++ call that initializes a session


def alongside(session_work: Callable[[], T], other_work: Callable[[], U]) -> tuple[T, U]:
    """(session_work(), other_work()): `session_work` (which creates ONNX Runtime sessions) in a thread,
    `other_work` in this one once that thread is inside `initialize_session` (or has finished: a binding
    without that call runs the two one after the other). Exceptions are raised here, `other_work`'s first."""
    entered = threading.Event()
    box: dict[str, Any] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == GIL_FREE_CALL:
            sys.setprofile(None)
            entered.set()

    def run() -> None:
        sys.setprofile(profile)
        try:
            box["value"] = session_work()
        except BaseException as exc:  # re-raised in the calling thread
            box["error"] = exc
        finally:
            sys.setprofile(None)
            entered.set()

    thread = threading.Thread(target=run, name="specrt-session-load", daemon=True)
    thread.start()
    entered.wait()
    try:
        other = other_work()
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"], other
