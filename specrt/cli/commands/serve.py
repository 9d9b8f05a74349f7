"""`specrt serve`: the OpenAI-compatible server (see the README, "Serving")."""

from __future__ import annotations

from pathlib import Path

import click

from ..main import KType, handle_errors, main


@main.command("serve")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--method", type=click.Choice(["draft", "ngram", "medusa", "none"]), default=None,
              help="Default drafting method (default: draft when the bundle has one, else ngram).")
@click.option("--num-speculative-tokens", "k", default="auto", show_default=True, type=KType(),
              help="Default tokens drafted per step, or 'auto' (adaptive).")
@click.option("--max-concurrency", default=1, show_default=True, type=click.IntRange(min=1),
              help="Generations running at once (one loaded generator each).")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(min=0),
              help="Requests waiting for a slot before the server answers 429.")
@click.option("--backend", default="auto", show_default=True,
              type=click.Choice(["auto", "ort", "torch", "trt", "ort-cuda", "ort-trt"]))
@click.option("--api-key", default=None, envvar="SPECRT_API_KEY",
              help="Require 'Authorization: Bearer KEY' on /v1/* (or set SPECRT_API_KEY).")
@click.option("--served-model-name", default=None, help="Model id in the API (default: the bundle directory name).")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="CPU threads in all, split over the slots (default: all cores).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@handle_errors
def serve_cmd(bundle, host, port, method, k, max_concurrency, max_queue, backend, api_key, served_model_name,
              threads, log_level):
    """Serve BUNDLE with the OpenAI API (/v1/completions, /v1/chat/completions) on HOST:PORT."""
    try:
        import uvicorn

        from ...serve import create_app
    except ImportError as exc:
        raise click.ClickException(f"{exc.name} is not installed: pip install 'specrt[serve]'") from None

    app = create_app(bundle, served_model_name=served_model_name, api_key=api_key,
                     max_concurrency=max_concurrency, max_queue=max_queue, method=method,
                     num_speculative_tokens=k, backend=backend, threads=threads)
    click.echo(f"serving {bundle} as {app.state.service.config.served_model_name!r} on http://{host}:{port}/v1 "
               f"({max_concurrency} slot(s), queue {max_queue})", err=True)
    from ...serve.access_log import configure

    configure(log_level)  # our per-request line (method, path, status, tokens, duration) replaces uvicorn's
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30, access_log=False)
