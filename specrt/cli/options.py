"""Click options shared by several commands, built from the runtime's registries (no hard-coded lists)."""

from __future__ import annotations

import click

from specrt.runtime.backends import BACKENDS
from specrt.runtime.request import METHODS


def backend_option(help_text: str = "Run-time backend: auto picks trt / ort-cuda / ort / torch by what is installed."):
    return click.option("--backend", default="auto", show_default=True, type=click.Choice(BACKENDS), help=help_text)


def method_option(default: str | None = None, *, allow_none: bool = True, help_text: str | None = None):
    choices = [m for m in METHODS if allow_none or m != "none"]
    return click.option("--method", type=click.Choice(choices), default=default, show_default=default is not None,
                        help=help_text or ("Drafting method (default: auto, every source the bundle has in one tree sized by "
                                            "measured goodput; hybrid in a bundle with a draft head only)."))


def methods_option(ctx, param, value) -> tuple[str, ...] | None:
    """`specrt bench --methods`: labels split at the commas outside brackets (specrt/bench/method_label.py)."""
    from specrt.bench.method_label import LABEL, split_labels

    if value is None:
        return None
    labels = split_labels(str(value))
    for label in labels:
        if "[" in label and not LABEL.match(label):
            raise click.BadParameter(f"{label!r}: only method auto takes sources in brackets, e.g. auto[-head] or "
                                     "auto[ngram,recycle]")
    return labels


class BatchSize(click.ParamType):
    """--max-batch: an integer >= 0 or 'auto'."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or isinstance(value, int) and value >= 0:
            return value
        try:
            n = int(str(value))
        except ValueError:
            n = -1
        if n < 0:
            self.fail(f"{value!r} is not an integer >= 0 or 'auto'", param, ctx)
        return n


def prefix_cache_options(fn):
    """--prefix-cache-mb and --no-prefix-cache (the batch engine's prefix cache: runtime/batch/prefix_cache.py);
    the command gets `prefix_cache_mb` (0 when turned off) and `no_prefix_cache`: use `prefix_cache_budget`."""
    from specrt.runtime.prefix_budget import DEFAULT_PREFIX_CACHE_MB

    fn = click.option("--no-prefix-cache", is_flag=True,
                      help="Prefill every prompt in full (no KV rows reused from earlier prompts).")(fn)
    return click.option("--prefix-cache-mb", default=DEFAULT_PREFIX_CACHE_MB, show_default=True,
                        type=click.FloatRange(min=0),
                        help="Memory for prompt KV rows kept across requests (batch engine; LRU; 0 = off); a "
                             "prompt that starts with a kept prefix prefills only the rest, output unchanged.")(fn)


def prefix_cache_budget(prefix_cache_mb: float, no_prefix_cache: bool) -> float:
    return 0.0 if no_prefix_cache else prefix_cache_mb
