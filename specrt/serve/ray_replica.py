"""The replica side of `specrt serve --ray`: what runs inside each Ray Serve replica when it starts.

`replica_app` loads the bundle once (checksums verified) into the replica's own slots and returns the
same FastAPI app as `specrt serve`, plus:
- every response carries `x-specrt-replica: <replica id>`;
- `/health` adds `replica`, `node`, `replicas` (running replicas of the deployment) and `replica_states`;
- `/metrics` adds the gauge `specrt_replica_info{replica,node} 1`, so a scrape names the replica it reached.
A bundle that cannot be loaded raises `ReplicaLoadError`, whose one-line message (marked with
LOAD_FAILED) the driver finds in Ray's deployment error and shows to the user.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REPLICA_HEADER = "x-specrt-replica"
LOAD_FAILED = "specrt replica could not load the bundle"
STATUS_TTL_S = 1.0  # /health asks the Serve controller for the replica count at most this often


class ReplicaLoadError(RuntimeError):
    """A replica could not load its bundle; the message is one line that names the bundle and the cause."""


class ReplicaHeader:
    """Pure ASGI middleware: name the replica in every HTTP response."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named_send)


def replica_states(app_name: str, deployment: str) -> dict[str, int]:
    """Replica counts by state ({"RUNNING": 2, "STARTING": 1}) from the Serve controller (a blocking call)."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    dep = app.deployments.get(deployment) if app else None
    return {str(k): int(v) for k, v in dep.replica_states.items()} if dep else {}


def health_info(replica: str, node: str, app_name: str, deployment: str) -> Callable[[], Awaitable[dict]]:
    """The /health extra of a replica: its names and the deployment's replica counts (cached STATUS_TTL_S)."""
    cache: dict[str, Any] = {"t": -STATUS_TTL_S, "states": {}}

    async def info() -> dict[str, Any]:
        if time.monotonic() - cache["t"] >= STATUS_TTL_S:
            try:
                cache["states"] = await asyncio.to_thread(replica_states, app_name, deployment)
            except Exception:  # noqa: BLE001 - the controller is unreachable: report what is known
                cache["states"] = {}
            cache["t"] = time.monotonic()
        states = cache["states"]
        return {"replica": replica, "node": node, "replicas": states.get("RUNNING", 0), "replica_states": states}

    return info


def replica_app(bundle: str, app_kwargs: dict[str, Any]) -> Any:
    """Build this replica's FastAPI app: load `bundle` into its slots and name the replica. Runs on the replica."""
    from prometheus_client import Gauge
    from ray import serve

    from specrt.serve.app import create_app

    ctx = serve.get_replica_context()
    replica, node = ctx.replica_tag, socket.gethostname()
    try:
        app = create_app(bundle, health_extra=health_info(replica, node, ctx.app_name, ctx.deployment), **app_kwargs)
    except Exception as exc:  # noqa: BLE001 - reported as one line (Ray would show a traceback per attempt)
        raise ReplicaLoadError(f"{LOAD_FAILED} {bundle} (replica {replica} on {node}): "
                               f"{type(exc).__name__}: {exc}".replace("\n", " ")) from None
    Gauge("specrt_replica_info", "The Ray Serve replica that answered this scrape", ["replica", "node"],
          registry=app.state.service.metrics.registry).labels(replica, node).set(1)
    app.add_middleware(ReplicaHeader, replica=replica)
    return app
