"""`specrt demo`: the packaged pair, plain vs speculative decoding, side by side."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..main import KType, handle_errors, main
from ..progress import step_progress


@main.command("demo")
@click.option("--output", default=Path("artifacts/demo"), show_default=True, type=click.Path(path_type=Path),
              help="Where the compiled demo bundle is kept (reused while current).")
@click.option("--backend", default="auto", show_default=True,
              type=click.Choice(["auto", "ort", "torch", "trt", "ort-cuda", "ort-trt"]))
@click.option("--method", default="draft", show_default=True, type=click.Choice(["draft", "ngram", "medusa"]))
@click.option("--num-speculative-tokens", "k", default="2", show_default=True, type=KType(),
              help="k per step, or auto (faster on this pair, but drafts more per step: lower accepted/drafted).")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1),
              help="Timed runs per prompt (median, spread min-max).")
@click.option("--models", default=None, type=click.Path(path_type=Path), hidden=True,
              help="Another pair in the packaged layout (target/, draft/, medusa/).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def demo_cmd(output, backend, method, k, max_new_tokens, repeats, models, as_json):
    """Compile the packaged demo pair and compare plain and speculative decoding."""
    from rich.console import Console

    from ..demo import ASSETS, bundle_is_current, ensure_bundle, run_demo
    from ...demo_screen import DemoScreen

    models = models or ASSETS
    screen = DemoScreen(Console(stderr=as_json))
    if not as_json:
        current = bundle_is_current(models, output)
        screen.announce(current, output)
        screen.warn_if_busy()
        if not current:  # the live compile display ends here, before any result is printed
            with step_progress() as progress:
                ensure_bundle(models, output, progress)
    result = run_demo(output, models, backend=backend, method=method, k=k, max_new_tokens=max_new_tokens,
                      repeats=repeats, progress=None, on_prompt=None if as_json else screen.row,
                      on_start=None if as_json else screen.start)
    if as_json:
        click.echo(json.dumps({"prompts": result["prompts"], "summary": result["summary"],
                               "bundle": result["bundle"], "backend": result["backend"]}, indent=2))
        return
    screen.summary(result)
