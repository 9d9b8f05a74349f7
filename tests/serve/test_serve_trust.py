"""Issue 26 (serve): API keys from the environment and in UTF-8, output-changing fields refused."""

from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner

from serve_helpers import serving

from specrt.cli.main import main

COMPLETION = {"model": "tiny", "prompt": "import os", "max_tokens": 3, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def test_empty_api_key_variable_is_refused(pair_bundle, monkeypatch):
    monkeypatch.setenv("SPECRT_API_KEY", "")
    res = CliRunner().invoke(main, ["serve", str(pair_bundle), "--port", "0"])
    assert res.exit_code == 2, res.output
    assert "SPECRT_API_KEY is set but empty" in res.output and len(res.output.strip().splitlines()) == 1


def test_non_ascii_key_is_compared_as_utf8(pair_generator):
    key = "clé-ключ"
    with serving(pair_generator, served_model_name="tiny", api_key=key) as srv:
        ok = httpx.post(f"{srv.url}/v1/completions", json=COMPLETION, timeout=60,
                        headers={"authorization": f"Bearer {key}".encode("utf-8")})
        assert ok.status_code == 200, ok.text
        latin = httpx.post(f"{srv.url}/v1/completions", json=COMPLETION, timeout=60,
                           headers={"authorization": f"Bearer {key}".encode("utf-8").decode("latin-1")
                                    .encode("utf-8")})
        assert latin.status_code == 401


@pytest.mark.parametrize("field, value, param", [
    ("tools", [TOOL], "tool_choice"),  # tool_choice auto (the default): the plain template has no tool-call format
    ("tool_choice", "required", "tool_choice"),  # no tools
    ("functions", [TOOL["function"]], "functions"), ("min_tokens", 3, "min_tokens")])
def test_tool_calls_that_cannot_be_served_are_refused(server, field, value, param):
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT | {field: value}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("field, value", [("tools", []), ("tool_choice", "none")])
def test_tool_defaults_are_accepted(server, field, value):
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT | {field: value}, timeout=60)
    assert r.status_code == 200, r.text


def test_half_sent_headers_are_closed_after_the_header_timeout(pair_generator, monkeypatch):
    import socket
    import threading
    import time

    import uvicorn

    from specrt.serve import create_app
    from specrt.serve.header_timeout import HeaderTimeoutH11

    monkeypatch.setattr(HeaderTimeoutH11, "header_timeout_s", 1.0)
    config = uvicorn.Config(create_app(pair_generator, served_model_name="tiny"), host="127.0.0.1", port=0,
                            log_level="warning", http=HeaderTimeoutH11)
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        ok = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=COMPLETION, timeout=60)
        assert ok.status_code == 200  # whole requests are served
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
        t0 = time.monotonic()
        assert s.recv(100) == b""  # closed by the server
        assert time.monotonic() - t0 < 5
        s.close()
    finally:
        server.should_exit = True
        t.join(10)
