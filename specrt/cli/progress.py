"""Progress display for long steps (rich), on stderr so that --json output stays clean."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def quiet_onnxruntime() -> None:
    """ONNX Runtime's native warnings (sessions the quantizer and validators open) are written straight to the
    terminal, under rich's live display, which then redraws the step list below them again and again: only
    its errors are shown while the steps run. Does nothing where ONNX Runtime is not installed."""
    try:
        import onnxruntime
    except ImportError:
        return
    onnxruntime.set_default_logger_severity(3)


@contextlib.contextmanager
def step_progress(enabled: bool = True) -> Iterator[Callable[[str], Callable[[], None]]]:
    """Yields `progress(description) -> done()`: one spinner line per step, ticked when done."""
    if not enabled:
        yield lambda description: (lambda: None)
        return
    console = Console(stderr=True)
    quiet_onnxruntime()
    # Started on the first step only: an error before any step then prints no empty progress line.
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=console, transient=False)

    def start(description: str) -> Callable[[], None]:
        if not progress.live.is_started:
            progress.start()
        task = progress.add_task(description, total=1)
        t0 = time.perf_counter()

        def done() -> None:
            progress.update(task, completed=1, description=f"{description} [{time.perf_counter() - t0:.1f}s]")

        return done

    try:
        yield start
    finally:
        if progress.live.is_started:
            progress.stop()
