"""`specrt serve`: the OpenAI-compatible server (see the README, "Serving")."""

from __future__ import annotations

from pathlib import Path

import click

from specrt.cli.main import KType, handle_errors, main
from specrt.cli.options import BatchSize, backend_option, method_option, prefix_cache_budget, prefix_cache_options


@main.command("serve")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@method_option(help_text="Default drafting method (default: auto, every source the bundle has in one tree).")
@click.option("--num-speculative-tokens", "k", default="auto", show_default=True, type=KType(),
              help="Default tokens drafted per step, or 'auto' (adaptive).")
@click.option("--max-concurrency", default=1, show_default=True, type=click.IntRange(min=1),
              help="Generations running at once (one loaded generator each).")
@click.option("--max-batch", default="auto", show_default=True, type=BatchSize(),
              help="Continuous batching: N requests decode together on one loaded model (0 = off: one generator "
                   "per --max-concurrency slot). auto: 4 per CPU core (at most 16, fewer if their KV would pass a "
                   "quarter of the memory) when the bundle's fused graph batches on this backend, else off; off "
                   "with --max-concurrency > 1 or --ray.")
@prefix_cache_options
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(min=0),
              help="Requests waiting for a slot before the server answers 429.")
@backend_option()
@click.option("--api-key", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1/* (or set SPECRT_API_KEY).")
@click.option("--served-model-name", default=None, help="Model id in the API (default: the bundle directory name).")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="CPU threads in all, split over the slots (default: all cores).")
@click.option("--shutdown-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds running and queued requests get to finish after SIGTERM or Ctrl-C; then they end with "
                   "a 503 (streams: an error event) and the server exits.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.option("--ray", "use_ray", is_flag=True,
              help="Deploy on Ray Serve: replicas of this server across a Ray cluster (needs specrt[ray]).")
@click.option("--replicas", default=None, type=click.IntRange(min=1), help="--ray: a fixed number of replicas [1].")
@click.option("--min-replicas", default=None, type=click.IntRange(min=1), help="--ray: autoscale from A replicas...")
@click.option("--max-replicas", default=None, type=click.IntRange(min=1), help="...to B (on ongoing requests).")
@click.option("--ray-address", default=None, help="--ray: join this Ray cluster (default: start a local Ray instance).")
@click.option("--cpus-per-replica", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="--ray: CPUs Ray reserves per replica (and its threads unless --threads is given).")
@handle_errors
def serve_cmd(bundle, host, port, method, k, max_concurrency, max_batch, prefix_cache_mb, no_prefix_cache, max_queue,
              backend, api_key, served_model_name, threads, shutdown_timeout, log_level, use_ray, replicas, min_replicas,
              max_replicas, ray_address, cpus_per_replica):
    """Serve BUNDLE with the OpenAI API (/v1/completions, /v1/chat/completions) on HOST:PORT.

    With --ray, --threads counts per replica."""
    import os

    from specrt.serve.config import api_key_from

    api_key = api_key_from(api_key, os.environ)
    ray_given = [f for f, v in (("--replicas", replicas), ("--min-replicas", min_replicas),
                                ("--max-replicas", max_replicas), ("--ray-address", ray_address),
                                ("--cpus-per-replica", cpus_per_replica != 1.0)) if v]
    if use_ray:
        if shutdown_timeout != 30.0:
            raise click.UsageError("--shutdown-timeout does not apply with --ray (Ray Serve gives requests 30 s)")
        app_kwargs = dict(served_model_name=served_model_name, api_key=api_key, max_concurrency=max_concurrency,
                          max_queue=max_queue, method=method, num_speculative_tokens=k, backend=backend,
                          threads=threads)
        return serve_ray(bundle, host, port, log_level, replicas, min_replicas, max_replicas, ray_address,
                         cpus_per_replica, app_kwargs)
    if ray_given:
        raise click.UsageError(f"{', '.join(ray_given)} only apply with --ray")
    try:
        import uvicorn

        from specrt.serve import create_app
    except ImportError as exc:
        raise click.ClickException(f"{exc.name} is not installed: pip install 'specrt[serve]'") from None

    app = create_app(bundle, served_model_name=served_model_name, api_key=api_key,
                     max_concurrency=max_concurrency, max_queue=max_queue, method=method,
                     num_speculative_tokens=k, backend=backend, threads=threads, max_batch=max_batch,
                     prefix_cache_mb=prefix_cache_budget(prefix_cache_mb, no_prefix_cache))
    sock = listen_socket(host, port)  # bound here, so the banner shows the real port (also for --port 0)
    real_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    engine = app.state.engine
    slots = (f"batch of up to {engine.max_batch}" if engine is not None
             else f"{app.state.service.pool.size} slot(s), no batching")
    click.echo(f"serving {bundle} as {app.state.service.config.served_model_name!r} on http://{shown}:{real_port}/v1 "
               f"({slots}, queue {max_queue})", err=True)
    from specrt.serve.access_log import configure

    configure(log_level)  # our per-request line (method, path, status, tokens, duration) replaces uvicorn's
    from specrt.serve.header_timeout import HeaderTimeoutH11

    _Server = _server_class(app.state.service, shutdown_timeout)
    # uvicorn's own limit (it cancels the requests' tasks: a traceback each) only backs up the service's own, which
    # answers them: a step in progress ends first
    config = uvicorn.Config(app, host=host, port=real_port, log_level=log_level,
                            timeout_graceful_shutdown=shutdown_timeout + BACKSTOP_S, access_log=False,
                            http=HeaderTimeoutH11)
    try:
        _Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the captured Ctrl-C after its graceful shutdown
        pass


BACKSTOP_S = 5.0  # after --shutdown-timeout, how long uvicorn waits for the answers before it cancels the requests


def _server_class(service, shutdown_timeout: float):
    import asyncio
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a second Ctrl-C during the graceful shutdown quits at once (exit 130): uvicorn's
        forced exit cancels every task (a traceback each) and lets the interpreter tear down while the batch
        engine's thread is inside ONNX Runtime, which aborts the process (seen: exit 134, 'terminate called').
        The first SIGTERM or Ctrl-C gives the requests `shutdown_timeout` seconds, then `service.shut_down` ends
        those left with a 503 (before: uvicorn cancelled them, a traceback each, and clients got a bare 500 or a
        cut stream); a graceful SIGTERM exits 0, as a graceful Ctrl-C does (uvicorn re-raised it: exit -15)."""

        loop = None

        async def serve(self, sockets=None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets=sockets)

        def handle_exit(self, sig, frame) -> None:
            if self.should_exit and sig == signal.SIGINT:
                import os
                import sys

                sys.stderr.write("forced quit: requests still running were cut off\n")
                sys.stderr.flush()
                os._exit(130)
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if first and self.loop is not None:
                self.loop.call_soon_threadsafe(self.loop.call_later, shutdown_timeout, service.shut_down)
            captured = getattr(self, "_captured_signals", None)  # uvicorn raises these again once it has stopped
            if sig == signal.SIGTERM and captured and captured[-1] == sig:
                captured.pop()

    return Server


def listen_socket(host: str, port: int):
    """A listening TCP socket on host:port; a clear one-line error when that is impossible."""
    import socket

    from specrt.core.errors import SpecrtError

    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)  # connections made right after the banner wait in the backlog until uvicorn accepts
    except OSError as exc:
        raise SpecrtError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def serve_ray(bundle, host, port, log_level, replicas, min_replicas, max_replicas, ray_address, cpus_per_replica,
              app_kwargs):
    """`specrt serve --ray`: Ray is imported only here."""
    from specrt.serve.ray_config import RayConfig

    config = RayConfig(replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                       address=ray_address, cpus_per_replica=cpus_per_replica)
    try:
        from specrt.serve.ray_deploy import serve_on_ray
    except ImportError as exc:
        raise click.ClickException(f"{exc.name} is not installed: pip install 'specrt[ray]'") from None
    serve_on_ray(bundle, config, host=host, port=port, app_kwargs=app_kwargs, log_level=log_level,
                 log=lambda m: click.echo(m, err=True))
