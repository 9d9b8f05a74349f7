"""The driver side of `specrt serve --ray`: deploy the OpenAI-compatible app as a Ray Serve deployment.

    server = RayServer.start("artifacts/demo", RayConfig(replicas=2), host="127.0.0.1", port=8000,
                             app_kwargs={"max_concurrency": 1})
    ...                                   # http://127.0.0.1:8000/v1, answered by either replica
    server.shutdown()                     # running requests finish first (30 s at most)

Each replica builds its app when it starts (ray_replica.replica_app): the bundle path is opened on the
node that runs the replica, so it must be readable there. Needs the `ray` extra: pip install 'specrt[ray]'.
"""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Optional

import ray
from ray import serve

from ..errors import InvalidArgument, SpecrtError
from .ray_config import RayConfig
from .ray_replica import LOAD_FAILED, replica_app


class RayDeployError(SpecrtError):
    """Ray could not be started or reached, or the deployment did not come up (e.g. a replica failed to load)."""


def build_application(bundle: str, config: RayConfig, app_kwargs: dict[str, Any]) -> Any:
    """A Serve application: `config`'s replicas of the app `specrt serve` builds from `bundle` and `app_kwargs`."""
    def build_app() -> Any:  # runs on each replica when it starts
        return replica_app(bundle, app_kwargs)

    options = config.deployment_options(app_kwargs.get("max_concurrency", 1), app_kwargs.get("max_queue", 64))

    @serve.deployment(**options)
    @serve.ingress(build_app)
    class SpecrtReplica:
        """One replica: the OpenAI-compatible app of `specrt serve` on the replica's own slots."""

    return SpecrtReplica.bind()


def load_failure(exc: BaseException, app_name: str) -> Optional[str]:
    """The replica's one-line load error, from Ray's exception or the failed deployment's status message."""
    texts = [str(exc)]
    try:
        app = serve.status().applications.get(app_name)
        texts += [dep.message for dep in app.deployments.values()] if app else []
    except Exception:  # noqa: BLE001 - Serve is gone: the exception text is all there is
        pass
    for text in texts:
        found = re.search(rf"{re.escape(LOAD_FAILED)}[^\n]*", text or "")
        if found:
            return found.group(0)
    return None


def check_capacity(config: RayConfig) -> None:
    """On a local Ray instance, replicas that can never be placed would leave serve.run waiting forever."""
    cpus = ray.cluster_resources().get("CPU", 0.0)
    need = config.initial_replicas * config.cpus_per_replica
    if need > cpus + 1e-9:
        raise InvalidArgument(f"{config.initial_replicas} replica(s) x {config.cpus_per_replica} CPUs need {need:g} "
                              f"CPUs, the local Ray instance has {cpus:g}: lower --cpus-per-replica or the replicas")


class RayServer:
    """A running deployment; `shutdown()` removes it (and the Ray instance, when this process started it)."""

    def __init__(self, config: RayConfig, url: str, owns_ray: bool) -> None:
        self.config, self.url, self.owns_ray = config, url, owns_ray
        self.closed = False

    @classmethod
    def start(cls, bundle: str | Path, config: RayConfig, *, host: str = "127.0.0.1", port: int = 8000,
              app_kwargs: Optional[dict[str, Any]] = None, init_kwargs: Optional[dict[str, Any]] = None
              ) -> "RayServer":
        """Start (or join) Ray, deploy, and wait until every initial replica has loaded the bundle."""
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"--port must be 1..65535 with --ray (the Ray Serve proxy needs a fixed port), "
                                  f"got {port}")
        kwargs = dict(app_kwargs or {})
        kwargs["threads"] = config.threads_per_replica(kwargs.get("threads"))
        owns_ray = not ray.is_initialized()
        if owns_ray:
            try:
                ray.init(address=config.address, **(init_kwargs or {}))
            except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ... : one line for the user
                where = f"the Ray cluster at {config.address}" if config.address else "a local Ray instance"
                raise RayDeployError(f"cannot start or reach {where}: {type(exc).__name__}: {exc}") from None
        server = cls(config, f"http://{host}:{port}", owns_ray)
        try:
            if config.address is None:
                check_capacity(config)
            serve.start(http_options={"host": host, "port": port})
            serve.run(build_application(str(bundle), config, kwargs), name=config.app_name, route_prefix="/")
        except BaseException as exc:
            message = None if isinstance(exc, SpecrtError) else load_failure(exc, config.app_name)
            server.shutdown()
            if isinstance(exc, SpecrtError):
                raise
            if message is None and not isinstance(exc, Exception):
                raise  # KeyboardInterrupt while waiting: the caller reports it
            raise RayDeployError(message or f"Ray Serve could not deploy {bundle}: "
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        return server

    def replica_states(self) -> dict[str, int]:
        """Replica counts by state, e.g. {"RUNNING": 2}."""
        app = serve.status().applications.get(self.config.app_name)
        dep = app.deployments.get(self.config.app_name) if app else None
        return dict(dep.replica_states) if dep else {}

    def shutdown(self) -> None:
        """Graceful: Serve stops routing new requests and waits for running ones. On a cluster this process
        joined, only this application is deleted; a Ray instance this process started is stopped."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.config.address is None:
                serve.shutdown()
            else:
                serve.delete(self.config.app_name)
        finally:
            if self.owns_ray:
                ray.shutdown()


def wait_for_signal() -> None:
    """Block until SIGINT (Ctrl-C) or SIGTERM."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_on_ray(bundle: str | Path, config: RayConfig, *, host: str, port: int, app_kwargs: dict[str, Any],
                 log: Callable[[str], None] = print) -> None:
    """`specrt serve --ray`: deploy, serve until SIGINT/SIGTERM, then shut down gracefully."""
    if config.address is None:  # a bundle on this machine: fail fast, before Ray starts (replicas verify checksums)
        from ..bundle import read_manifest

        read_manifest(bundle, verify_checksums=False)
    server = RayServer.start(bundle, config, host=host, port=port, app_kwargs=app_kwargs)
    try:
        slots = app_kwargs.get("max_concurrency", 1)
        scale = (f"{config.min_replicas}..{config.max_replicas} replicas (autoscaling)" if config.autoscaling
                 else f"{config.initial_replicas} replica(s)")
        log(f"serving {bundle} on Ray Serve at {server.url}/v1: {scale} x {slots} slot(s), "
            f"{config.cpus_per_replica:g} CPU(s) each; Ctrl-C stops")
        wait_for_signal()
        log("shutting down: running requests finish first")
    finally:
        server.shutdown()
