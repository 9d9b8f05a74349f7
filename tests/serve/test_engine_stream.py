"""`--max-batch N`: the server reads each request from an async stream the engine's thread feeds (engine_stream.py),
through the one admission queue (slots.py): its thread count does not grow with N, a client that leaves frees its
batch row within a step, a full queue is a 429, and stop strings cut the text as without batching."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import httpx

from serve_helpers import hold_the_batch, metric, serving, wait_until

# one server in a fresh process: 8 clients at once, then its threads (the OS's count and Python's, less the loop's
# default executor, which tokenizes prompts and grows with concurrent requests whatever the batch)
THREADS = r"""
import os, sys, threading, time
import httpx, uvicorn
from specrt.serve import create_app

app = create_app(sys.argv[1], max_batch=int(sys.argv[2]), method="none", backend="ort", threads=1,
                 served_model_name="m")
server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
threading.Thread(target=server.run, daemon=True).start()
while not server.started:
    time.sleep(0.01)
url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1/completions"
codes = []
clients = [threading.Thread(target=lambda i=i: codes.append(httpx.post(url, timeout=300, json={
    "model": "m", "prompt": f"x = {i}\n", "max_tokens": 64, "temperature": 0}).status_code)) for i in range(8)]
for c in clients:
    c.start()
for c in clients:
    c.join()
assert codes == [200] * 8, codes
default_pool = sum(t.name.startswith(("asyncio_", "uvloop_")) for t in threading.enumerate())
print("THREADS", len(os.listdir("/proc/self/task")) - default_pool, threading.active_count() - default_pool)
server.should_exit = True
"""


def _threads(bundle, max_batch: int) -> tuple[int, int]:
    proc = subprocess.run([sys.executable, "-c", THREADS, str(bundle), str(max_batch)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    os_threads, py_threads = proc.stdout.split("THREADS")[-1].split()
    return int(os_threads), int(py_threads)


def test_the_servers_thread_count_does_not_grow_with_max_batch(pair_bundle):
    # before: one parked worker thread per slot (8 clients: 2 threads at --max-batch 2, 8 at --max-batch 8); native
    # threads (ONNX Runtime's, the tokenizer's, libuv's) start lazily, so the OS's count may differ by one or two
    (os2, py2), (os8, py8) = _threads(pair_bundle, 2), _threads(pair_bundle, 8)
    assert py8 == py2 and os8 <= os2 + 2, (os2, py2, os8, py8)


def _slow_steps(monkeypatch, seconds: float) -> list[int]:
    """Every scheduler step takes `seconds` longer (a slow model); returns the step counter."""
    from specrt.runtime.batch.scheduler import Scheduler

    steps, step = [0], Scheduler.step

    def slow(self):
        steps[0] += 1
        time.sleep(seconds)
        return step(self)

    monkeypatch.setattr(Scheduler, "step", slow)
    return steps


def test_a_cancelled_stream_frees_its_batch_row_within_one_step(pair_bundle, monkeypatch):
    from specrt.serve import create_app
    from specrt.serve.worker import Delta, Done, Job

    steps = _slow_steps(monkeypatch, 0.01)
    app = create_app(str(pair_bundle), max_batch=2, method="none", backend="ort", threads=1)
    service, engine = app.state.service, app.state.engine
    try:
        job = Job.of(service.generator.prepare("def f(x):\n", max_new_tokens=200, temperature=0, method="none"))

        async def main():
            slot = await service.pool.acquire()
            stream = service.start(service.pool, slot, job, None)
            assert isinstance(await stream.next_event(), Delta)
            # the first token is emitted between leaving prefill and joining the running rows (engine thread)
            wait_until(lambda: engine.scheduler.active == 1, 30, "the request to join the running rows")
            stream.cancel()
            at_cancel = steps[0]
            while not isinstance(event := await stream.next_event(), Done):
                pass
            return event, steps[0] - at_cancel

        done, steps_after = asyncio.run(main())
        assert done.finish_reason == "cancelled" and done.completion_tokens < 200
        assert steps_after <= 1  # the step in progress, if any: then its row is free
        assert engine.scheduler.active == 0 and service.pool.busy == 0
    finally:
        service.close()
        engine.close()


def test_a_full_admission_queue_answers_429_and_waiting_requests_count_once(pair_bundle, monkeypatch):
    # the first request holds the one batch row until the test releases it (before: 120 steps of 20 ms, which the
    # polling below had to outrun on a loaded machine)
    with serving(str(pair_bundle), max_batch=1, max_queue=1, method="none", served_model_name="tiny",
                 backend="ort") as server:
        release = hold_the_batch(monkeypatch, 1)
        codes: list[int] = []

        def one(i: int) -> None:
            codes.append(httpx.post(f"{server.url}/v1/completions", timeout=120, json={
                "model": "tiny", "prompt": f"x = {i}\n", "max_tokens": 120, "temperature": 0}).status_code)

        first, second = threading.Thread(target=one, args=(0,)), threading.Thread(target=one, args=(1,))
        try:
            first.start()
            wait_until(lambda: metric(server, "vllm:num_requests_running") >= 1, 30, "the first request to run")
            second.start()
            wait_until(lambda: metric(server, "specrt_queue_depth") >= 1, 30, "the second request to wait")
            assert metric(server, "vllm:num_requests_waiting") == 1  # the one queue, counted once
            one(2)  # the batch row taken, the queue's one place too
            assert codes == [429]
        finally:
            release.set()
            first.join()
            second.join()
        assert sorted(codes) == [200, 200, 429]


def test_stop_strings_under_batching_cut_as_without(pair_bundle, pair_generator):
    prompt = "def load(path):\n"
    alone = pair_generator.generate(prompt, 24, temperature=0, method="none").text
    stop = alone[len(alone) // 3:len(alone) // 3 + 2]  # a stop string the greedy answer reaches
    ref = pair_generator.generate(prompt, 24, temperature=0, method="none", stop=[stop])
    assert ref.finish_reason == "stop"
    with serving(str(pair_bundle), max_batch=2, method="none", served_model_name="tiny", backend="ort") as server:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": [stop]}
        r = httpx.post(f"{server.url}/v1/completions", timeout=120, json=body).json()
        assert r["choices"][0]["text"] == ref.text and r["choices"][0]["finish_reason"] == "stop"
        assert r["usage"]["completion_tokens"] == len(ref.token_ids)
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120, json={**body, "stream": True}) as s:
            import json

            chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        assert "".join(c["choices"][0]["text"] for c in chunks) == ref.text
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_request_that_fails_to_start_gives_its_slot_back(pair_bundle, monkeypatch):
    # a producer that raises after the slot was taken (an unexpected error): a 500, and the slot is free again, so
    # the next requests are served (before: both slots held for ever, the third request waited without end)
    from specrt.serve.engine_stream import Producers

    real, fails = Producers.start, [2]

    def start(self, slot, job, stream):
        if fails[0]:
            fails[0] -= 1
            raise RuntimeError("boom")
        return real(self, slot, job, stream)

    monkeypatch.setattr(Producers, "start", start)
    with serving(str(pair_bundle), max_batch=2, method="none", served_model_name="tiny", backend="ort") as server:
        post = lambda **extra: httpx.post(f"{server.url}/v1/completions", timeout=60, json={  # noqa: E731
            "model": "tiny", "prompt": "x = 1\n", "max_tokens": 4, "temperature": 0, **extra}).status_code
        assert [post(), post()] == [500, 500]
        assert [post(), post(), post()] == [200, 200, 200]
        # a request of several choices one of which fails to start: a 500 too (before: it waited for ever)
        choices = dict(n=2, temperature=1.0, seed=1)
        for stream in (False, True):
            fails[0] = 1
            assert post(stream=stream, **choices) == 500
        assert post(**choices) == 200
        assert metric(server, "vllm:num_requests_running") == 0
