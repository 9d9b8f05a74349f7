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

from specrt.core.errors import InvalidArgument, SpecrtError
from specrt.serve.ray_config import RayConfig
from specrt.serve.ray_replica import LOAD_FAILED, replica_app, replica_states


class RayDeployError(SpecrtError):
    """Ray could not be started or reached, or the deployment did not come up (e.g. a replica failed to load)."""


def build_application(bundle: str, config: RayConfig, app_kwargs: dict[str, Any]) -> Any:
    """A Serve application: `config`'s replicas of the app `specrt serve` builds from `bundle` and `app_kwargs`
    (create_app's keyword arguments; `threads` counts per replica)."""
    app_kwargs = {**app_kwargs, "threads": config.threads_per_replica(app_kwargs.get("threads"))}

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

    def __init__(self, config: RayConfig, url: str, owns_ray: bool, watchdog: Any = None) -> None:
        self.config, self.url, self.owns_ray, self.watchdog = config, url, owns_ray, watchdog
        self.closed = False

    @classmethod
    def start(cls, bundle: str | Path, config: RayConfig, *, host: str = "127.0.0.1", port: int = 8000,
              app_kwargs: Optional[dict[str, Any]] = None, init_kwargs: Optional[dict[str, Any]] = None,
              log_level: str = "info") -> "RayServer":
        """Start Ray (a new local instance of its own unless `config.address` names a cluster to join: never a
        cluster that merely happens to run on this machine), deploy, and wait until every initial replica has
        loaded the bundle."""
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"--port must be 1..65535 with --ray (the Ray Serve proxy needs a fixed port), "
                                  f"got {port}")
        owns_ray = not ray.is_initialized()
        watchdog = None
        if owns_ray:
            try:
                ray.init(address=config.address or "local", **(init_kwargs or {}))
            except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ... : one line for the user
                where = f"the Ray cluster at {config.address}" if config.address else "a local Ray instance"
                raise RayDeployError(f"cannot start or reach {where}: {type(exc).__name__}: {exc}") from None
            if config.address is None:  # the local instance dies with this process, even on SIGKILL
                from specrt.serve.ray_watchdog import spawn_watchdog

                watchdog = spawn_watchdog()
        server = cls(config, f"http://{host}:{port}", owns_ray, watchdog)
        try:
            if config.address is None:
                check_capacity(config)
            serve.start(http_options={"host": host, "port": port})
            serve.run(build_application(str(bundle), config, app_kwargs or {}), name=config.app_name,
                      route_prefix="/", logging_config={"log_level": log_level.upper()})
        except SpecrtError:
            server.shutdown()
            raise
        except Exception as exc:  # noqa: BLE001 - Ray's errors carry pages of traceback: one line for the user
            message = load_failure(exc, config.app_name)  # read before shutdown: the deployment status holds it
            server.shutdown()
            first = (str(exc).strip().splitlines() or [""])[0]
            raise RayDeployError(message or f"Ray Serve could not deploy {bundle}: {type(exc).__name__}: {first}"
                                 ) from None
        except BaseException:  # KeyboardInterrupt while waiting for the replicas: clean up, the caller reports it
            server.shutdown()
            raise
        return server

    def replica_states(self) -> dict[str, int]:
        """Replica counts by state, e.g. {"RUNNING": 2}."""
        return replica_states(self.config.app_name, self.config.app_name)

    def shutdown(self) -> None:
        """Graceful: Serve stops routing new requests and waits for running ones. Only this application is
        deleted (never other Serve applications of the cluster); a Ray instance this process started is
        stopped, and its watchdog ends any process left behind."""
        if self.closed:
            return
        self.closed = True
        try:
            serve.delete(self.config.app_name)
        except Exception:  # noqa: BLE001 - nothing deployed yet; the instance we own is stopped below anyway
            if not self.owns_ray:
                raise
        finally:
            if self.owns_ray:
                ray.shutdown()
            if self.watchdog is not None:
                self.watchdog.stop()


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
                 log_level: str = "info", log: Callable[[str], None] = print) -> None:
    """`specrt serve --ray`: deploy, serve until SIGINT/SIGTERM, then shut down gracefully."""
    if config.address is None:  # a bundle on this machine: fail fast, before Ray starts (replicas verify checksums)
        from specrt.bundle.manifest import read_manifest

        read_manifest(bundle, verify_checksums=False)
    server = RayServer.start(bundle, config, host=host, port=port, app_kwargs=app_kwargs, log_level=log_level)
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


CONFIG_ARGS = {"replicas": int, "min_replicas": int, "max_replicas": int, "cpus_per_replica": float,
               "target_ongoing_requests": float}
APP_ARGS = {"served_model_name": str, "api_key": str, "max_concurrency": int, "max_queue": int, "method": str,
            "num_speculative_tokens": str, "backend": str, "threads": int}


def typed(name: str, value: Any, kind: type) -> Any:
    """An argument from a Serve config file or `serve run key=value` (strings there) as its type."""
    if name == "num_speculative_tokens" and value == "auto":
        return value
    kind = int if name == "num_speculative_tokens" else kind
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"args.{name} must be {kind.__name__}, got {value!r}") from None


def app_builder(args: dict[str, Any]) -> Any:
    """Application builder for Ray Serve config files: `serve run`, `serve deploy`, a KubeRay RayService.

        import_path: specrt.serve.ray_deploy:app_builder
        args: {bundle: /models/demo, min_replicas: 1, max_replicas: 4, cpus_per_replica: 2, max_concurrency: 2}

    `bundle` is required (a path readable on every node); the other keys are the `specrt serve --ray` options
    in snake case."""
    args = dict(args)
    bundle = args.pop("bundle", None)
    if not bundle:
        raise InvalidArgument("args.bundle is required: the bundle directory, readable on every node")
    unknown = sorted(set(args) - set(CONFIG_ARGS) - set(APP_ARGS))
    if unknown:
        raise InvalidArgument(f"unknown args {unknown}; known: bundle, {', '.join([*CONFIG_ARGS, *APP_ARGS])}")
    config = RayConfig(**{k: typed(k, v, CONFIG_ARGS[k]) for k, v in args.items() if k in CONFIG_ARGS})
    app_kwargs = {k: typed(k, v, APP_ARGS[k]) for k, v in args.items() if k in APP_ARGS}
    return build_application(str(bundle), config, app_kwargs)
