"""Bounds on rendering a checkpoint's chat template: time and size, checked while the template runs.

A chat template is code from the checkpoint (Jinja, compiled to Python). The sandbox already refuses
attribute tricks and caps `range()` at 100,000 items; this module adds what it leaves open:

- **time**: `sys.settrace` on the rendering thread watches only the template's own frames (file name
  `<template>`) and Jinja's (filters over a `range`), and stops the render at the deadline, so a nested loop ends within `max_seconds`;
- **size**: every value the template can blow up in one native step is checked *before* it is built:
  `*` (repetition), `**` (big integers), `%` and `str.format` (padding widths), `+` and `~` (joins),
  integer arguments of filters and calls (`center(10**9)`), and the rendered text as it streams out.

A hit bound raises `TemplateBoundExceeded` (an `InvalidArgument`: exit 2 in the CLI, 400 in `serve`).
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import jinja2

from specrt.core.errors import InvalidArgument

_JINJA_DIR = os.path.dirname(jinja2.__file__)
_WIDE_FIELD = re.compile(r"\d{7,}")  # a format width or precision of a million or more characters


class TemplateBoundExceeded(InvalidArgument):
    """The chat template ran past its time bound or tried to build text past its size bound."""


@dataclass(frozen=True)
class RenderBounds:
    """`max_seconds`: wall time of one render; `max_chars`: the largest string (and integer argument) a
    template may build, and the rendered prompt's length."""

    max_seconds: float = 1.0
    max_chars: int = 1_000_000

    def __post_init__(self) -> None:
        if not (isinstance(self.max_seconds, (int, float)) and 0 < self.max_seconds <= 600):
            raise ValueError(f"max_seconds must be in (0, 600], got {self.max_seconds!r}")
        if not (isinstance(self.max_chars, int) and 1_000 <= self.max_chars <= 100_000_000):
            raise ValueError(f"max_chars must be in [1000, 1e8], got {self.max_chars!r}")

    def too_big(self, what: str) -> TemplateBoundExceeded:
        return TemplateBoundExceeded(f"the model's chat template tried to build {what}, over the "
                                     f"{self.max_chars:,}-character bound on a rendered prompt")


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


def check_binop(bounds: RenderBounds, op: str, left: Any, right: Any) -> None:
    """Refuse `left op right` when its result would exceed the bounds; called before it is computed."""
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if _length(seq) and isinstance(n, int) and _length(seq) * n > bounds.max_chars:
                raise bounds.too_big(f"a sequence of {_length(seq):,} x {n:,} items")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right * math.log2(abs(left)) > 4096:
                raise bounds.too_big(f"the integer {left} ** {right}")
    elif op == "%" and isinstance(left, str):
        check_format(bounds, left, right if isinstance(right, tuple) else (right,))
    elif op == "+" and _length(left) and _length(right):
        if _length(left) + _length(right) > bounds.max_chars:
            raise bounds.too_big(f"a join of {_length(left) + _length(right):,} items")


def check_format(bounds: RenderBounds, fmt: str, args: Iterable[Any]) -> None:
    if _WIDE_FIELD.search(fmt):
        raise bounds.too_big("a format field a million characters wide")
    check_args(bounds, args)


def check_args(bounds: RenderBounds, args: Iterable[Any]) -> None:
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > bounds.max_chars:
            raise bounds.too_big(f"something {a:,} wide (an argument)")


def check_result(bounds: RenderBounds, value: Any) -> Any:
    if _length(value) > bounds.max_chars:
        raise bounds.too_big(f"a value of {_length(value):,} items")
    return value


def bounded_filter(bounds: RenderBounds, fn: Callable) -> Callable:
    """A Jinja filter whose integer arguments and result are checked (keeps `pass_context` etc.)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check_args(bounds, list(args) + list(kwargs.values()))
        return check_result(bounds, fn(*args, **kwargs))

    return wrapper


def bounded_join(bounds: RenderBounds, join: Callable) -> Callable:
    """The template's `~` operator (`str_join` / `markup_join` in compiled templates), size-checked."""

    def wrapper(seq: Iterable[Any]) -> Any:
        parts = list(seq)
        if sum(len(p) if isinstance(p, str) else 64 for p in parts) > bounds.max_chars:
            raise bounds.too_big("a joined string")
        return join(parts)

    return wrapper


class Deadline:
    """`with Deadline(bounds):` stops code compiled from a template (`<template>` frames) at the deadline."""

    def __init__(self, bounds: RenderBounds) -> None:
        self.bounds = bounds
        self.end = 0.0
        self._previous: Any = None

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if time.perf_counter() > self.end:
            raise TemplateBoundExceeded(f"the model's chat template ran longer than its "
                                        f"{self.bounds.max_seconds:g} s bound")
        return self._line

    def _call(self, frame: Any, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if name != "<template>" and not name.startswith(_JINJA_DIR) and name != __file__:
            return None  # line events only in the template's code, Jinja's filters and our checks
        return self._line(frame, event, arg)

    def __enter__(self) -> "Deadline":
        self.end = time.perf_counter() + self.bounds.max_seconds
        self._previous = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._previous)


def render_bounded(bounds: RenderBounds, chunks: Iterable[str]) -> str:
    """Join a template's streamed output under the deadline and the size bound."""
    out: list[str] = []
    total = 0
    with Deadline(bounds):
        for chunk in chunks:
            total += len(chunk)
            if total > bounds.max_chars:
                raise bounds.too_big(f"a prompt of more than {total:,} characters")
            out.append(chunk)
    return "".join(out)
