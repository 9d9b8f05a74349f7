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
@click.option("--repeats", default=3, show_default=True, type=int, help="Timed runs per prompt (median).")
@click.option("--models", default=None, type=click.Path(path_type=Path), hidden=True,
              help="Another pair in the packaged layout (target/, draft/, medusa/).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def demo_cmd(output, backend, method, k, max_new_tokens, repeats, models, as_json):
    """Compile the packaged demo pair and compare plain and speculative decoding."""
    from ..demo import ASSETS, run_demo

    from rich.console import Console

    console = Console(stderr=as_json)

    def show(row):
        if as_json:
            return
        console.rule(f"[bold]{row['kind']}[/bold]")
        console.print(row["prompt"], end="", markup=False, style="dim")
        console.print(row["text"], markup=False, style="green")
        console.print(f"identical to plain: {row['identical']}   acceptance {row['acceptance_rate']:.2f}   "
                      f"mean accepted {row['mean_accepted_tokens']:.2f}   plain {row['plain_tokens_per_second']:.0f} tok/s   "
                      f"speculative {row['speculative_tokens_per_second']:.0f} tok/s   speedup {row['speedup']:.2f}x")

    with step_progress(enabled=not as_json) as progress:
        result = run_demo(output, models or ASSETS, backend=backend, method=method, k=k,
                          max_new_tokens=max_new_tokens, repeats=repeats, progress=progress, on_prompt=show)
    if as_json:
        click.echo(json.dumps({"prompts": result["prompts"], "summary": result["summary"],
                               "bundle": result["bundle"], "backend": result["backend"]}, indent=2))
        return
    s = result["summary"]
    console.rule("[bold]summary[/bold]")
    console.print(f"backend {result['backend']}, method {result['method']}: outputs identical on every prompt: "
                  f"{s['identical']}; acceptance {s['acceptance_rate']:.2f}; plain {s['plain_tokens_per_second']:.0f} tok/s, "
                  f"speculative {s['speculative_tokens_per_second']:.0f} tok/s: [bold]{s['speedup']:.2f}x[/bold]")
