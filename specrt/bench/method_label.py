"""Bench method labels: a drafting method, or `auto[SOURCES]` (method auto with `auto_sources`, runtime/proposers/
auto_sources.py) so that one interleaved run compares auto with and without a source, each label its own row:

    specrt bench B --suite spec-bench --methods 'ngram,auto[-head],auto'      # quote: [] are shell patterns
    specrt bench B --methods 'auto[ngram,recycle],auto'

`split_labels` splits --methods at the commas outside brackets (specrt/cli/options.py `methods_option`); `request_options` turns a label into the request's
options; `check_labels` refuses a label the bundle cannot run (one line naming the label).
"""

from __future__ import annotations

import re
from typing import Any

from specrt.core.errors import InvalidArgument

LABEL = re.compile(r"^auto\[([^\[\]]*)\]$")
_SPLIT = re.compile(r",(?![^\[]*\])")  # a comma not inside [...]


def split_labels(text: str) -> tuple[str, ...]:
    """'ngram,auto[-head],auto' -> ('ngram', 'auto[-head]', 'auto') (spaces dropped, empty items skipped)."""
    return tuple(v.strip().replace(" ", "") for v in _SPLIT.split(text) if v.strip())


def request_options(label: str) -> dict[str, Any]:
    """The request options of a label: {"method": ...} and, for auto[SOURCES], {"auto_sources": SOURCES}."""
    m = LABEL.match(label)
    return {"method": "auto", "auto_sources": m.group(1)} if m else {"method": label}


def check_labels(gen, labels, methods: list[str] | None = None) -> None:
    """Each label's method is one of `methods` (default: the bundle's) and its sources are ones the bundle has."""
    from specrt.runtime.proposers.auto_sources import available, resolve
    from specrt.runtime.request import GenerationRequest

    methods = gen.methods if methods is None else methods
    for label in labels:
        options = request_options(label)
        if options["method"] not in methods:
            raise InvalidArgument(f"method {options['method']!r} is not available with this bundle; choose from "
                                  f"{', '.join(methods)}")
        if "auto_sources" in options:
            try:
                resolve(GenerationRequest(**options).auto_sources, available(gen))
            except InvalidArgument as exc:
                raise InvalidArgument(f"--methods {label}: {exc}") from None
