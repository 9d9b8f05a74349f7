"""What the CLI prints around long runs: narrow-terminal packing, repeat spread, busy-machine warnings,
optional-dependency checks, and the flag names that replace API parameter names in CLI errors.

Small pure helpers (no rich at import time) shared by `demo`, `bench`, `generate` and `inspect`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import statistics
from typing import Iterable, Sequence

from specrt.core.errors import InvalidArgument, MissingDependency
from specrt.core.text import pack  # noqa: F401  (re-exported: the CLI modules import it from here)

COMPACT_WIDTH = 100  # below this many columns the CLI prints compact tables


def require(module: str, flag: str, extra: str) -> None:
    """Raise MissingDependency naming the flag and the extra when `module` cannot be imported."""
    if importlib.util.find_spec(module) is None:
        raise MissingDependency(f"{flag} needs {module}, which is not installed: pip install 'specrt[{extra}]'")


def check_repeats(repeats: int, flag: str = "--repeats") -> int:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InvalidArgument(f"{flag} must be an integer >= 1, got {repeats!r}")
    return repeats


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def busy_warning() -> str | None:
    """A one-line warning when the 1-minute load average exceeds the core count (timings are noisy)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load <= cores:
        return None
    return (f"warning: the machine is busy (load average {load:.1f} on {cores} cores): "
            "speedups vary from run to run; compare runs on an idle machine")


# API parameter names -> the CLI flags that set them (for errors raised by the library).
FLAGS = {
    "max_new_tokens": "--max-new-tokens",
    "num_speculative_tokens": "--num-speculative-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "auto_sources": "--auto-sources",
    "ngram_min": "--ngram-min",
    "ngram_max": "--ngram-max",
    "min_n": "--ngram-min",
    "max_n": "--ngram-max",
    "repeats": "--repeats",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
    "repetition_penalty": "--repetition-penalty",
}
_PARAM = re.compile(r"(?<![\w-])(" + "|".join(sorted(FLAGS, key=len, reverse=True)) + r")(?=\W|$)")


def flag_names(message: str, keep: Iterable[str] = ()) -> str:
    """Rewrite API parameter names in a library error into CLI flag names (`max_new_tokens` ->
    `--max-new-tokens`); names in `keep` stay (e.g. a bundle's own max_seq_len)."""
    keep = set(keep)
    return _PARAM.sub(lambda m: m.group(1) if m.group(1) in keep else FLAGS[m.group(1)], message)
