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
