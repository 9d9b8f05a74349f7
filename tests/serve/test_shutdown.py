"""`specrt serve` stopped by SIGTERM with requests in flight: they finish within --shutdown-timeout, or end then with
a 503 (a stream: an error event and [DONE]); either way the process exits 0, without tracebacks."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx

# `specrt serve` with every batch step 50 ms longer (a slow model): requests stay in flight long enough to be stopped
SLOW_SERVE = r"""
import sys, time
from specrt.runtime.batch.scheduler import Scheduler
step = Scheduler.step
def slow(self):
    time.sleep(0.05)
    return step(self)
Scheduler.step = slow
from specrt.cli.main import main
sys.argv = ["specrt", "serve", *sys.argv[1:]]
main()
"""


def _start(bundle, *args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVE, str(bundle), "--port", "0", "--threads", "1",
                             "--max-batch", "2", "--served-model-name", "m", *args],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    seen, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        seen.append(proc.stderr.readline())
        if m := re.search(r"on http://127\.0\.0\.1:(\d+)/v1", seen[-1]):
            url = f"http://127.0.0.1:{m.group(1)}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the banner comes before uvicorn listens
                try:
                    httpx.get(f"{url}/health", timeout=5)
                    return proc, url
                except httpx.TransportError:
                    time.sleep(0.05)
    proc.kill()
    raise AssertionError("the server did not start: " + "".join(seen))


class Client(threading.Thread):
    """One request in a thread: streamed ones signal `started` at their first chunk; `result` is what came back."""

    def __init__(self, url: str, stream: bool, max_tokens: int, **extra) -> None:
        super().__init__(daemon=True)
        self.url, self.stream, self.started = url, stream, threading.Event()
        self.body = {"model": "m", "prompt": "def f(x):\n", "max_tokens": max_tokens, "temperature": 0,
                     "speculative": {"method": "none"}, "stream": stream, **extra}
        self.result: dict = {}

    def run(self) -> None:
        with httpx.Client(timeout=120) as c:
            if not self.stream:
                r = c.post(f"{self.url}/v1/completions", json=self.body)
                self.result = {"status": r.status_code, "body": r.json()}
                return
            with c.stream("POST", f"{self.url}/v1/completions", json=self.body) as r:
                lines = []
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        self.started.set()
                self.result = {"status": r.status_code, "lines": lines}


def _stop(proc: subprocess.Popen, clients: list[Client]) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    for c in clients:
        c.join(timeout=60)
    try:
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, proc.stderr.read(), time.monotonic() - t0


def test_sigterm_lets_running_and_queued_requests_finish_and_exits_0(pair_bundle):
    proc, url = _start(pair_bundle)
    streams = [Client(url, True, 20) for _ in range(2)]  # 20 steps of >= 50 ms: ~1 s each
    for c in streams:
        c.start()
        assert c.started.wait(60)
    queued = Client(url, False, 20)  # both batch rows taken: it waits in the admission queue
    queued.start()
    time.sleep(0.2)
    rc, err, _ = _stop(proc, [*streams, queued])
    assert rc == 0, err  # before: uvicorn raised the SIGTERM again once stopped: the process died of it (-15)
    for c in streams:
        chunks = [json.loads(line[6:]) for line in c.result["lines"] if line.startswith("data: {")]
        assert c.result["lines"][-1] == "data: [DONE]" and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert queued.result["status"] == 200 and queued.result["body"]["usage"]["completion_tokens"] == 20
    assert "Traceback" not in err


def test_requests_left_at_the_shutdown_timeout_end_with_503_and_the_server_exits_0(pair_bundle):
    proc, url = _start(pair_bundle, "--shutdown-timeout", "0.5")
    stream = Client(url, True, 100)  # 100 steps of >= 50 ms: far beyond the timeout
    stream.start()
    assert stream.started.wait(60)
    # three sampled choices on the other batch row: one decodes, two wait for it (the stream holds the first row)
    choices = Client(url, False, 100, n=3, temperature=1.0, seed=1)
    choices.start()
    time.sleep(0.5)
    queued = Client(url, False, 100)  # waits in the admission queue
    queued.start()
    time.sleep(0.2)
    rc, err, took = _stop(proc, [stream, choices, queued])
    # before: uvicorn cancelled them after its 30 s: a traceback each, a bare 'Internal Server Error' or a cut stream
    assert rc == 0 and "Traceback" not in err, err
    assert took < 20
    assert stream.result["status"] == 200 and stream.result["lines"][-1] == "data: [DONE]"
    last = json.loads(stream.result["lines"][-2][6:])
    assert last["error"]["code"] == "server_shutting_down", last
    for c in (choices, queued):
        assert c.result["status"] == 503 and c.result["body"]["error"]["code"] == "server_shutting_down", c.result


def test_shutdown_timeout_is_refused_with_ray(pair_bundle):
    from helpers import run_cli

    r = run_cli("serve", pair_bundle, "--ray", "--shutdown-timeout", "5")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--shutdown-timeout does not apply with --ray" in r.stderr
