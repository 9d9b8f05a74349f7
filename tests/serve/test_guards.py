"""Server hardening (issue 10 #14-#15): request values into OpenAI-style 400s, a 500 keeps the connection,
docs closed under --api-key, a body read timeout."""

from __future__ import annotations

import http.client
import json
import socket
import time

import httpx
import pytest

from serve_helpers import serving

COMPLETION = {"model": "tiny", "prompt": "import os", "max_tokens": 3, "temperature": 0}


def post_raw(server, path: str, text: str) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=text.encode("utf-8"), timeout=30,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", '{"model": "tiny", "prompt": "abc\\ud800def", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"model": "tiny", "prompt": ["abc\\udfffdef"], "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800"}], '
                             '"max_tokens": 2}', "messages.0"),
    ("/v1/completions", '{"model": "tiny", "prompt": "x", "stop": ["\\ud800"], "max_tokens": 2}', "stop"),
])
def test_lone_surrogates_are_400(server, path, body, param):
    r = post_raw(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "surrogate" in r.json()["error"]["message"]


@pytest.mark.parametrize("field, value", [("seed", -1), ("seed", 2**64), ("temperature", 5e-324),
                                          ("logprobs", 6), ("logprobs", -1), ("logprobs", True), ("echo", True),
                                          ("best_of", 2), ("frequency_penalty", 2.5), ("presence_penalty", -3),
                                          ("repetition_penalty", 0), ("logit_bias", {"1": 200}),
                                          ("logit_bias", {"99999999": 1}), ("logit_bias", {"x": 1}), ("n", 17),
                                          ("logit_bias", {"1": 5, "01": -100}),
                                          ("stream_options", {"include_usage": True}),
                                          ("ignore_eos", "yes"), ("stop_token_ids", [-1]), ("min_p", 1.5),
                                          ("stop_token_ids", [99999999]), ("stop_token_ids", 3),
                                          # vLLM extensions not implemented: refused, never silently ignored
                                          ("bad_words", ["os"]),
                                          ("skip_special_tokens", False), ("guided_choice", ["a", "b"])])
def test_unsupported_or_out_of_range_fields_are_400_naming_the_field(server, field, value):
    r = httpx.post(f"{server.url}/v1/completions", json=COMPLETION | {field: value}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("message, param", [({"role": "wizard", "content": "hi"}, "messages.1.role"),
                                            ({"role": "user"}, "messages.1.content"),
                                            ({"role": "user", "content": None}, "messages.1.content")])
def test_chat_messages_need_a_known_role_and_content(server, message, param):
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "system", "content": "be brief"}, message]}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_developer_message_is_rendered_as_a_system_one(server):
    def chat(role):
        body = {"model": "tiny", "max_tokens": 6, "temperature": 0,
                "messages": [{"role": role, "content": "be brief"}, {"role": "user", "content": "import os"}]}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"], r.json()["usage"]["prompt_tokens"]

    assert chat("developer") == chat("system")


@pytest.mark.parametrize("field, value", [("logprobs", None), ("echo", False), ("best_of", 1),
                                          ("frequency_penalty", 0), ("user", "me"), ("ignore_eos", False),
                                          ("stop_token_ids", []), ("skip_special_tokens", True), ("min_p", 0.5)])
def test_harmless_defaults_are_accepted(server, field, value):
    r = httpx.post(f"{server.url}/v1/completions", json=COMPLETION | {field: value}, timeout=60)
    assert r.status_code == 200, r.text


class Exploding:
    """A real generator whose tokenizer path fails unexpectedly for one prompt."""

    def __init__(self, gen):
        self._gen = gen

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def encode_prompt(self, prompt):  # the server passes the prompt's token ids (runtime/prepared.py)
        text = prompt if isinstance(prompt, str) else self._gen.tokenizer.decode(list(prompt))
        if text.strip() == "explode":
            raise RuntimeError("boom")
        return self._gen.encode_prompt(prompt)


def test_internal_error_is_a_500_that_keeps_the_connection(pair_generator):
    with serving(Exploding(pair_generator), served_model_name="tiny") as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        headers = {"content-type": "application/json"}
        conn.request("POST", "/v1/completions", json.dumps(COMPLETION | {"prompt": "explode"}), headers)
        first = conn.getresponse()
        body = json.loads(first.read())
        assert first.status == 500 and body["error"]["type"] == "server_error"
        assert (first.getheader("connection") or "").lower() != "close"
        sock = conn.sock
        conn.request("POST", "/v1/completions", json.dumps(COMPLETION), headers)
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read())["choices"]
        assert conn.sock is sock  # the same keep-alive connection served the next request
        conn.close()


def test_docs_are_closed_when_a_key_is_set(pair_generator):
    with serving(pair_generator, served_model_name="tiny", api_key="secret") as srv:
        for path in ("/docs", "/openapi.json", "/redoc"):
            r = httpx.get(f"{srv.url}{path}", timeout=10)
            assert r.status_code in (401, 404), (path, r.status_code)
    with serving(pair_generator, served_model_name="tiny") as srv:  # no key: the docs stay available
        assert httpx.get(f"{srv.url}/openapi.json", timeout=10).status_code == 200


def test_body_shorter_than_content_length_times_out(pair_generator):
    with serving(pair_generator, served_model_name="tiny", body_timeout_s=1.0) as srv:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\":")
        started = time.monotonic()
        reply = s.recv(4096).decode("latin-1")
        s.close()
        assert reply.startswith("HTTP/1.1 408"), reply
        assert time.monotonic() - started < 10


def test_stop_token_ids_and_ignore_eos_are_served(server, slot_generators):
    """vLLM's extensions: a stop id ends the completion where greedy decoding emits it (finish_reason stop, the
    token counted); ignore_eos is accepted (the tiny model emits no EOS here: the same completion)."""
    gen = slot_generators[0]
    ids = gen.generate(COMPLETION["prompt"], 12, method="none").token_ids
    i = next(j for j in range(3, len(ids)) if ids[j] not in ids[:j])
    body = COMPLETION | {"max_tokens": 12, "stop_token_ids": [ids[i]]}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    assert choice["finish_reason"] == "stop" and usage["completion_tokens"] == i + 1, r.json()
    assert choice["text"] == gen.generate(COMPLETION["prompt"], 12, method="none", stop_token_ids=[ids[i]]).text
    r = httpx.post(f"{server.url}/v1/completions", json=COMPLETION | {"max_tokens": 12, "ignore_eos": True},
                   timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 12, r.text
