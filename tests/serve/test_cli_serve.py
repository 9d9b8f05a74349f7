"""`specrt serve` as a user runs it: a subprocess on a loopback port, stopped by Ctrl-C (graceful)."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from serve_helpers import K

SPECRT = str(Path(sys.executable).with_name("specrt"))


def test_serve_help_and_bad_bundle(tmp_path):
    out = subprocess.run([SPECRT, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--max-concurrency" in out.stdout and "--api-key" in out.stdout
    assert "Default drafting method (default: auto," in " ".join(out.stdout.split())  # what the server uses (below)
    out = subprocess.run([SPECRT, "serve", str(tmp_path / "missing")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "does not exist" in out.stderr and "Traceback" not in out.stderr


def test_serve_subprocess(pair_bundle, pair_generator):
    import openai

    proc = subprocess.Popen([SPECRT, "serve", str(pair_bundle), "--port", "0", "--num-speculative-tokens", str(K),
                             "--served-model-name", "demo", "--threads", "1", "--api-key", "k"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        port, deadline, seen = None, time.monotonic() + 60, []
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/v1", seen[-1])  # the banner names the real port
            port = int(m.group(1)) if m else None
        assert port, "".join(seen)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=30)
        resp = client.completions.create(model="demo", prompt="import os", max_tokens=8, temperature=0)
        ref = pair_generator.generate("import os", 8, temperature=0, method="draft", num_speculative_tokens=K)
        assert resp.choices[0].text == ref.text
        assert resp.model_extra["speculative_stats"]["method"] == "auto"  # no `speculative`: the --help's default
        # one log line per request at the default level: method, path, status, tokens, duration
        logged, deadline = [], time.monotonic() + 10
        while time.monotonic() < deadline and not any("POST /v1/completions" in x for x in logged):
            try:
                logged.append(lines.get(timeout=0.5))
            except queue.Empty:
                pass
        line = next((x for x in logged if "POST /v1/completions" in x), "")
        assert re.fullmatch(r"INFO:\s+POST /v1/completions 200 8 tokens \d+\.\d\ds\n", line), logged
        assert not any('"POST /v1/completions HTTP/1.1"' in x for x in logged), "uvicorn's access line is replaced"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("specrt serve did not shut down on SIGINT")
    assert rc == 0


def test_a_second_ctrl_c_quits_at_once_without_tracebacks(pair_bundle):
    # the first Ctrl-C waits for open connections (graceful); a second one quits now, exit 130, one line
    import socket

    proc = subprocess.Popen([SPECRT, "serve", str(pair_bundle), "--port", "0", "--threads", "1"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        port, deadline, seen = None, time.monotonic() + 60, []
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            seen.append(proc.stderr.readline())
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/v1", seen[-1])
            port = int(m.group(1)) if m else None
        assert port, "".join(seen)
        conn = socket.create_connection(("127.0.0.1", port), timeout=10)
        # the banner comes before uvicorn runs: one whole request on this connection first, so the server is up
        # (signal handlers in place) and holds the connection (before: a 0.5 s sleep, which a loaded machine's
        # start-up could outlast; the first Ctrl-C then met no server and the exit was 0)
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += conn.recv(4096)
        head, body = reply.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))
        while len(body) < length:
            body += conn.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\nExpect: 100-continue\r\n\r\n")  # a request still arriving
        # the server asks for the body once its app reads it: the request is then in progress, and shutdown waits
        # for it (before: a 0.5 s sleep; a request the server had not read by then left an idle connection, which
        # the first Ctrl-C closed, and the server exited 0)
        cont = b""
        while b"\r\n\r\n" not in cont:
            cont += conn.recv(4096)
        assert cont.startswith(b"HTTP/1.1 100 "), cont
        proc.send_signal(signal.SIGINT)
        while "Waiting for connections to close" not in seen[-1] and time.monotonic() < deadline:
            seen.append(proc.stderr.readline())
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
        rest = proc.stderr.read()
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, "".join(seen) + rest
    assert "forced quit" in rest and "Traceback" not in rest and "terminate" not in rest, rest


def test_an_explicit_max_batch_beyond_memory_is_one_line_and_exit_2(pair_bundle):
    """Issue 49 #4: `serve --max-batch N` preallocated N slots' KV until the machine ran out of memory (only auto
    was capped); now N slots' KV is checked against the memory available first (10^7 toy slots: ~1 TB)."""
    from helpers import run_cli

    r = run_cli("serve", pair_bundle, "--max-batch", 10_000_000, "--backend", "ort", "--port", 0)
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "max_batch 10000000 needs 10000000 x" in line and "GiB of memory available" in line and "slots fit" in line
