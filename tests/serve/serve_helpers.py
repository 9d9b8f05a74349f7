"""What the serve tests share besides fixtures: a real uvicorn server on a loopback port, clients, waits and metrics.

A module of its own (not conftest.py): `from conftest import ...` picks whichever conftest pytest imported first
under that name, which depends on the order tests are collected in.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator

K = 3  # the server default k in these tests (explicit: 'auto' is another issue's policy)


class ServerThread:
    """uvicorn.Server in a background thread on 127.0.0.1 and a free port; stop() shuts it down gracefully."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    def start(self, timeout: float = 20.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@contextlib.contextmanager
def serving(generators: Any, chat_template: str | None = None, **kwargs: Any) -> Iterator[ServerThread]:
    """A server on `generators`; `chat_template`: a checkpoint template it renders chat with instead of the
    bundle's."""
    from specrt.serve import create_app

    kwargs.setdefault("num_speculative_tokens", K)
    app = create_app(generators, **kwargs)
    if chat_template is not None:
        from specrt.runtime.chat_template import ChatFormatter

        app.state.service.chat = ChatFormatter(chat_template)
    server = ServerThread(app).start()
    try:
        yield server
    finally:
        server.stop()


class Gated:
    """A real Generator whose decoding steps wait for `gate` and then `delay` seconds (a slow model)."""

    def __init__(self, gen: Any, delay: float = 0.0) -> None:
        self._gen = gen
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gen, name)

    def stream_tokens(self, *args: Any, **kwargs: Any):
        for item in self._gen.stream_tokens(*args, **kwargs):
            if not self.gate.wait(timeout=30):
                raise TimeoutError("the test gate was never opened")
            if self.delay:
                time.sleep(self.delay)
            yield item


def hold_the_batch(monkeypatch: Any, size: int) -> threading.Event:
    """The batch engine's steps (from now on) wait until `size` requests are in its scheduler, run one step with
    them, and then the batch stays as it is (each step waits after running) until the test sets the returned event:
    requests that run together, and a queue that stays full, without timing a slow model against the clients."""
    from specrt.runtime.batch.scheduler import Scheduler

    release, step = threading.Event(), Scheduler.step

    def held(self: Any) -> None:
        if len(self.waiting) + self.active < size and not release.is_set():
            time.sleep(0.005)  # a step with nothing done: the engine's loop takes in what arrived, then steps again
            return
        step(self)
        if self.active >= size and not release.wait(60):
            raise TimeoutError("the test never released the held batch")

    monkeypatch.setattr(Scheduler, "step", held)
    return release


def openai_client(server: ServerThread, api_key: str = "unused", **kwargs: Any):
    import openai

    kwargs.setdefault("timeout", 60)
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, **kwargs)


def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `predicate` (bounded by time) until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def metric(server: ServerThread, name: str, **labels: str) -> float:
    """The value of one sample of the server's /metrics (0 when absent)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0
