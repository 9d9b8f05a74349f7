"""response_format bounds through HTTP (issue 49): a schema deep enough to crash llguidance's compiler is a 400 and
the server answers the next request; schemas compile after admission on threads of their own, so a full queue
refuses at once and plain requests are not held up by compiles."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from serve_helpers import Gated, serving, wait_until

SPECRT = str(Path(sys.executable).with_name("specrt"))


def ref_chain(levels: int) -> dict:
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(levels)}
    defs[f"d{levels}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def big_schema(tag: str, n: int = 220) -> dict:
    """~200 KB (under the 256 KB bound) of objects of 20 properties: ~0.6 s to compile on the test tokenizer, more
    under load; `tag` makes it a schema not compiled before. (Optional properties are few: past ~500 in one
    object llguidance's parser refuses the object while decoding.)"""
    inner = {"type": "object", "properties": {f"q{j}": {"type": "string", "maxLength": 9} for j in range(20)}}
    return {"type": "object", "properties": {f"{tag}_{i}": inner for i in range(n)}}


def schema_body(schema: dict, max_tokens: int = 4) -> dict:
    return {"model": "tiny", "prompt": "{", "max_tokens": max_tokens, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}


def small_schema(tag: str) -> dict:
    """A schema not compiled before (by `tag`), quick to compile: for tests whose compiles a gate makes long."""
    return {"type": "object", "properties": {tag: {"type": "integer"}}, "required": [tag]}


PLAIN = {"model": "tiny", "prompt": "import os\n", "max_tokens": 4, "temperature": 0}


def test_a_schema_that_crashed_the_compiler_is_400_and_the_server_lives_on(pair_bundle):
    # 1000 object levels behind $refs (~94 KB) overflowed the native stack: SIGSEGV, the whole server gone
    proc = subprocess.Popen([SPECRT, "serve", str(pair_bundle), "--port", "0", "--threads", "1",
                             "--served-model-name", "tiny"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        port, deadline, seen = None, time.monotonic() + 120, []
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/v1", seen[-1])
            port = int(m.group(1)) if m else None
        assert port, "".join(seen)
        url = f"http://127.0.0.1:{port}/v1/completions"
        r = httpx.post(url, json=schema_body(ref_chain(1000)), timeout=120)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_response_format" and err["param"] == "response_format"
        assert "$refs" in err["message"] and "limit" in err["message"]
        assert httpx.post(url, json=PLAIN, timeout=120).status_code == 200
        ok = httpx.post(url, json=schema_body(ref_chain(20)), timeout=120)  # within the bounds: served
        assert ok.status_code == 200, ok.text
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_full_queue_refuses_at_once_before_compiling(slot_generators, monkeypatch):
    # the slot and the queue's one place stay taken until the test opens the gate, so a server that waited for a
    # place would not answer before the client gives up (20 s); a compile is seen where it starts (the generator's
    # compile_constraint: the tokenizer's conversion and the compile). Before: timed against a compile, which a
    # loaded machine made flip.
    gated = Gated(slot_generators[0])
    gated.gate.clear()
    compiled, real = [], type(slot_generators[0]).compile_constraint
    monkeypatch.setattr(type(slot_generators[0]), "compile_constraint",
                        lambda self, spec: compiled.append(spec) or real(self, spec))
    with serving([gated], max_queue=1, served_model_name="tiny") as srv:
        health = lambda: httpx.get(f"{srv.url}/health", timeout=10).json()  # noqa: E731
        fire = lambda body, timeout=120: httpx.post(f"{srv.url}/v1/completions", json=body,  # noqa: E731
                                                    timeout=timeout)
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(fire, {**PLAIN, "stream": True})
            wait_until(lambda: health()["busy"] == 1, what="the first request to take the slot")
            queued = pool.submit(fire, PLAIN)
            wait_until(lambda: health()["queued"] == 1, what="the second request to wait")
            try:
                r = fire(schema_body(big_schema("full")), timeout=20)
                compiled_before_the_answer = list(compiled)
            finally:
                gated.gate.set()
            assert running.result().status_code == queued.result().status_code == 200
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
        assert compiled_before_the_answer == []  # refused before compiling
        later = {"type": "object", "properties": {"later": {"type": "integer"}}}
        ok = httpx.post(f"{srv.url}/v1/completions", json=schema_body(later), timeout=120)
        assert ok.status_code == 200 and compiled, ok.text  # with a place free: compiled (the recorder sees it)


def test_plain_requests_are_not_held_up_by_compiling_schemas(slot_generators, monkeypatch):
    # every compile thread held (a gate: compiles that last until the test says) and more schemas waiting for one:
    # a plain request is answered meanwhile. Before: 8 compiles on the executor that tokenizes every request, then
    # each holding the slot; the plain request waited for them (here: until the gate opens, past its 30 s). Timed
    # against a real compile before, which a loaded machine made flip.
    import specrt.runtime.constraint as constraint
    from specrt.runtime.constraint_pool import CompilePool

    compiles = CompilePool(threads=2, seconds=120, wait_seconds=120)  # no limit reached while the gate holds
    monkeypatch.setattr(constraint, "COMPILE_POOL", compiles)
    real, release = constraint.ConstraintCompiler._matcher, threading.Event()

    def held(self, spec):
        release.wait(60)
        return real(self, spec)

    monkeypatch.setattr(constraint.ConstraintCompiler, "_matcher", held)
    with serving(slot_generators[:1], max_queue=64, served_model_name="tiny") as srv:
        url = f"{srv.url}/v1/completions"
        with ThreadPoolExecutor(8) as pool:
            try:
                schemas = [pool.submit(httpx.post, url, json=schema_body(small_schema(f"s{i}")), timeout=120)
                           for i in range(8)]
                wait_until(lambda: compiles.running == compiles.threads, 60, "the schemas to compile")
                plain = httpx.post(url, json=PLAIN, timeout=30)
                held_still = compiles.running == compiles.threads and not any(f.done() for f in schemas)
            finally:
                release.set()
            results = [f.result() for f in schemas]
        assert plain.status_code == 200 and held_still, plain.text
        assert all(r.status_code == 200 for r in results), [r.text for r in results]


def test_a_compile_past_its_time_is_400_and_a_busy_compiler_503(slot_generators, monkeypatch):
    import specrt.runtime.constraint as constraint
    from specrt.runtime.constraint_pool import CompilePool

    monkeypatch.setattr(constraint, "COMPILE_POOL", CompilePool(threads=1, seconds=0.05, wait_seconds=0.05))
    real, release = constraint.ConstraintCompiler._matcher, threading.Event()

    def held(self, spec):  # a compile that lasts until the test says (the real one, ~0.6 s, may end under load
        release.wait(60)  # before the next request arrives: then that one got the thread, not a 503)
        return real(self, spec)

    monkeypatch.setattr(constraint.ConstraintCompiler, "_matcher", held)
    with serving(slot_generators[:1], max_queue=4, served_model_name="tiny") as srv:
        url = f"{srv.url}/v1/completions"
        try:
            slow = httpx.post(url, json=schema_body(big_schema("slow")), timeout=120)
            assert slow.status_code == 400 and "took longer than 0.05 s" in slow.json()["error"]["message"], slow.text
            busy = httpx.post(url, json=schema_body(big_schema("next")), timeout=120)  # the one thread still compiles
            assert busy.status_code == 503 and busy.json()["error"]["code"] == "compiler_busy", busy.text
            assert int(busy.headers["retry-after"]) >= 1
        finally:
            release.set()
        assert httpx.post(url, json=PLAIN, timeout=120).status_code == 200
