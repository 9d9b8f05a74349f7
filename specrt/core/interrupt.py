"""Whether this process got Ctrl-C (SIGINT), even where a library swallowed the KeyboardInterrupt it raised.

A KeyboardInterrupt raised inside an import (onnxruntime's extension, torch.export's lazy modules) can come out as an
ImportError or AttributeError that a caller catches; the CLI then reported a wrong cause ("needs ONNX Runtime"), or
finished a compile the user had interrupted. `install()` (the CLI, on its main thread) records the signal before
raising KeyboardInterrupt as Python does; `interrupted()` tells the error handler and the bundle commit.
"""

from __future__ import annotations

import signal
import threading

_SEEN = threading.Event()


def _on_sigint(signum, frame):
    _SEEN.set()
    signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as without this handler


def install() -> None:
    """Record SIGINT from now on (main thread only; a no-op elsewhere or where SIGINT is not Python's default)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def interrupted() -> bool:
    return _SEEN.is_set()
