"""The batched server under load: many clients at once, with every kind of request, a prefix cache small enough to
evict, and clients that leave at every point. Each answer equals the same request's answer alone (greedy, and
seeded sampling), usage counts are the request's own, and once idle every slot, batch region and stream is free."""

from __future__ import annotations

import asyncio
import json
import random

import httpx

from serve_helpers import metric, serving, wait_until

# closed schemas: the toy model's answers complete within max_tokens (an open integer goes on for ever)
SCHEMA = {"type": "object", "required": ["a"], "additionalProperties": False, "properties": {"a": {"enum": [1, 22]}}}
TOOL = {"type": "function", "function": {"name": "get", "parameters": {
    "type": "object", "required": ["x"], "additionalProperties": False, "properties": {"x": {"enum": ["a", "b"]}}}}}
PROMPTS = ["import json\n", "def load(path):\n", "class Parser:\n    ", "x = [1, 2, 3]\n", "for i in range(10):\n"]
# renders the tools by name only (the toy bundle has 128 positions; without a template that renders tools, the
# server would tell them in a system message of their JSON)
TEMPLATE = ("{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\\n' }}{% endif %}"
            "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ '\\n' }}{% endfor %}assistant: ")
SMALL_CACHE_MB = 0.05  # the toy target's 16-token block is 8 KiB: 6 blocks, evicted all the time


def mixed_bodies() -> list[dict]:
    """Every kind of request: completions and chat, streamed or not (with usage), n, max_tokens, stop strings,
    logprobs, json_schema, forced tool calls, seeded sampling, speculative methods."""
    bodies, extras = [], [
        {}, {"n": 3}, {"stop": ["f"]}, {"stop": [" t", "("], "n": 2}, {"max_tokens": 1}, {"logprobs": 2},
        {"temperature": 0.8, "seed": 11}, {"temperature": 0.8, "seed": 5, "n": 2},
        {"speculative": {"method": "ngram", "num_speculative_tokens": 3}},
        {"speculative": {"method": "draft", "num_speculative_tokens": 2}}, {"speculative": {"method": "none"}},
        {"presence_penalty": 0.5}]
    for i, extra in enumerate(extras * 2):
        chat = i % 2 == 1
        body = {"model": "tiny", "max_tokens": 4 + 5 * (i % 4), "temperature": 0, **extra}
        if chat:
            body["messages"] = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
            if "logprobs" in body:
                body.update(logprobs=True, top_logprobs=body.pop("logprobs"))
        else:
            body["prompt"] = PROMPTS[i % len(PROMPTS)]
        if i % 3 == 0:
            body.update(stream=True, stream_options={"include_usage": True})
        bodies.append(body)
    for i in range(4):
        body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 24,
                "temperature": 0, "stream": i % 2 == 0}
        if i < 2:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
        else:
            body.update(tools=[TOOL], parallel_tool_calls=False,
                        tool_choice="required" if i == 2 else {"type": "function", "function": {"name": "get"}})
        bodies.append(body)
    return bodies


def _choices(body: dict, chunks: list[dict]) -> list[dict]:
    """A stream's chunks joined into the choices a non-streamed answer has."""
    by: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            e = by.setdefault(c["index"], {"index": c["index"], "text": "", "tool_calls": None, "logprobs": None,
                                           "finish_reason": None})
            e["text"] += c.get("text") or (c.get("delta") or {}).get("content") or ""
            e["tool_calls"] = (c.get("delta") or {}).get("tool_calls") or e["tool_calls"]
            for key, value in (c.get("logprobs") or {}).items():
                e["logprobs"] = e["logprobs"] or {}
                e["logprobs"][key] = e["logprobs"].get(key, []) + value
            e["finish_reason"] = c["finish_reason"] or e["finish_reason"]
    return [by[i] for i in sorted(by)]


def _plain(body: dict, answer: dict) -> dict:
    """The parts of an answer that must not depend on the load: choices (text, tool calls, logprobs, finish reason)
    and usage (but the prefix cache's cached_tokens, which depends on what ran before)."""
    choices = []
    for c in answer["choices"]:
        message = c.get("message") or {}
        calls = message.get("tool_calls") or c.get("tool_calls")
        choices.append({"index": c["index"], "finish_reason": c["finish_reason"], "logprobs": c.get("logprobs"),
                        "text": c["text"] if "text" in c else (message.get("content") or ""),
                        "calls": [(t["function"]["name"], t["function"]["arguments"]) for t in calls or []]})
    usage = answer.get("usage") or {}
    return {"choices": choices, "usage": {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens")}}


async def ask(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if not body.get("stream"):
        r = await client.post(url + path, json=body)
        assert r.status_code == 200, r.text
        return _plain(body, r.json())
    async with client.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        lines = [line async for line in r.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert not any("error" in c for c in chunks), chunks
    usage = chunks[-1]["usage"] if body.get("stream_options") else None
    return _plain(body, {"choices": _choices(body, [c for c in chunks if c["choices"]]), "usage": usage})


def close(a, b) -> bool:
    """Equal, floats (logprobs) within 1e-4: a token's logprob depends on the pass that scored it (docs/requests.md)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-4
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    return a == b


def together_then_alone(url: str, bodies: list[dict], alone_url: str | None = None) -> tuple[list, list]:
    async def main():
        async with httpx.AsyncClient(timeout=120) as c:
            together = await asyncio.wait_for(asyncio.gather(*(ask(c, url, b) for b in bodies)), 240)
            return together, [await ask(c, alone_url or url, b) for b in bodies]

    return asyncio.run(main())


def assert_idle(server) -> None:
    """No slot, batch region, stream or queue place held; the prefix cache's bytes are its blocks' bytes."""
    app = server.server.config.app
    service, sched = app.state.service, app.state.engine.scheduler
    wait_until(lambda: service.pool.busy == 0 and sched.active == 0, 20, "the server to be idle")
    assert service.pool.waiting == service.pool.admitted == 0 and not service.live
    assert sched.targets.used == 0 and not sched.waiting
    assert sched.drafts is None or sched.drafts.used == 0
    store, prefix = sched.prefix.store, sched.prefix
    if prefix.enabled:
        assert store.used_bytes == len(store) * prefix.block_bytes <= store.budget_bytes
    assert metric(server, "vllm:num_requests_running") == 0 and metric(server, "specrt_queue_depth") == 0


def test_mixed_requests_at_once_answer_as_each_alone(pair_bundle):
    bodies = mixed_bodies()
    with serving(str(pair_bundle), chat_template=TEMPLATE, max_batch=4, served_model_name="tiny", backend="ort",
                 prefix_cache_mb=SMALL_CACHE_MB) as server:
        together, alone = together_then_alone(server.url, bodies)
        assert_idle(server)
    for body, a, b in zip(bodies, together, alone):
        assert close(a, b), (body, a, b)
        if body.get("logprobs") and a["usage"]["completion_tokens"] is not None:  # one entry per counted token
            key = "content" if "messages" in body else "tokens"
            assert a["usage"]["completion_tokens"] == sum(len(c["logprobs"][key]) for c in a["choices"])
    assert sum(len(a["choices"]) for a in together) == sum(b.get("n", 1) for b in bodies)


def _ids(n: int, salt: int) -> list[int]:
    r = random.Random(salt)
    return [r.randrange(3, 319) for _ in range(n)]


def prefix_bodies() -> list[dict]:
    """Prompts sharing long prefixes, prompts that are prefixes of others, identical prompts sent at once, prompts at
    the context limit (127 of 128 positions: one token to generate)."""
    shared = _ids(100, 1)
    prompts = [shared[:n] for n in (16, 17, 32, 33, 48, 63, 64, 65, 80, 96, 100)]
    prompts += [shared[:n] + _ids(12, n) for n in (20, 40, 60, 90)]
    prompts += [shared + _ids(27, 7)] * 4 + [shared[:50] + _ids(77, 8)] * 2  # at the limit, identical
    prompts += [shared[:64]] * 3 + [_ids(40, 9)]
    bodies = []
    for i, p in enumerate(prompts):
        body = {"model": "tiny", "prompt": p, "max_tokens": min(128 - len(p), 1 + 7 * (i % 3)), "temperature": 0}
        if i % 4 == 1:
            body.update(temperature=0.9, seed=i)
        if i % 5 == 2:
            body.update(stream=True, stream_options={"include_usage": True})
        if i % 7 == 3:
            body["n"] = 2
        bodies.append(body)
    return bodies


def test_prefix_cache_evicting_under_load_answers_as_without_it(pair_bundle):
    bodies = prefix_bodies()
    with serving(str(pair_bundle), max_batch=4, served_model_name="tiny", backend="ort", method="ngram",
                 prefix_cache_mb=0) as cold:
        with serving(str(pair_bundle), max_batch=4, served_model_name="tiny", backend="ort", method="ngram",
                     prefix_cache_mb=SMALL_CACHE_MB) as warm:
            for _ in range(2):  # the second round finds the first's blocks (those not evicted)
                together, alone = together_then_alone(warm.url, bodies, alone_url=cold.url)
                for body, a, b in zip(bodies, together, alone):
                    assert close(a, b), (body, a, b)
            assert metric(warm, "vllm:prefix_cache_hits_total") > 0
            assert metric(warm, "specrt_prefix_cache_evicted_blocks_total") > 0
            assert metric(warm, "specrt_prefix_cache_bytes") <= metric(warm, "specrt_prefix_cache_budget_bytes")
            assert_idle(warm)
        assert_idle(cold)


async def leave(client: httpx.AsyncClient, url: str, body: dict, after) -> str:
    """Send `body` and leave: a stream after `after` chunks ("headers": as soon as the response starts), a plain
    request after `after` seconds."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if not body.get("stream"):
        try:
            r = await asyncio.wait_for(client.post(url + path, json=body), after)
            return f"answered {r.status_code}"
        except asyncio.TimeoutError:
            return "left"
    async with client.stream("POST", url + path, json=body) as r:
        if after == "headers":
            return "left"
        chunks = 0
        async for line in r.aiter_lines():
            chunks += line.startswith("data: {")
            if chunks >= after:
                return "left"
    return f"answered {r.status_code}"


def test_clients_leaving_at_every_point_free_every_slot(pair_bundle, monkeypatch):
    # clients leave while queued (8 of them beyond the 2 batch rows), before their first token, after 1 or 3
    # chunks, during a draft-model verify, a choice of n = 2 or a request on the one-request loop beside the batch
    # (logprobs, response_format); every step takes >= 20 ms (a slow model), so they leave mid-way
    import time

    from specrt.runtime.batch.scheduler import Scheduler
    from specrt.runtime.generator import Generator

    step, stream_tokens = Scheduler.step, Generator.stream_tokens
    monkeypatch.setattr(Scheduler, "step", lambda self: (time.sleep(0.02), step(self))[1])

    def slow_loop(self, *args, **kwargs):
        for item in stream_tokens(self, *args, **kwargs):
            time.sleep(0.02)
            yield item

    monkeypatch.setattr(Generator, "stream_tokens", slow_loop)
    kinds = [{}, {"n": 2}, {"speculative": {"method": "draft", "num_speculative_tokens": 4}}, {"logprobs": 1},
             {"response_format": {"type": "json_object"}}, {"temperature": 0.8, "seed": 1}]
    plans = [("headers", True), (1, True), (3, True), (0.05, False), (0.3, False)]
    bodies, afters = [], []
    for i in range(20):
        body = {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 60, "temperature": 0,
                **kinds[i % len(kinds)]}
        after, body["stream"] = plans[i % len(plans)]
        bodies.append(body)
        afters.append(after)
    with serving(str(pair_bundle), max_batch=2, served_model_name="tiny", backend="ort") as server:
        async def main():
            async with httpx.AsyncClient(timeout=60) as c:
                return await asyncio.gather(*(leave(c, server.url, b, a) for b, a in zip(bodies, afters)))

        outcomes = asyncio.run(main())
        assert outcomes.count("left") >= 15, outcomes
        assert_idle(server)
        assert metric(server, "specrt_requests_cancelled_total", endpoint="/v1/completions") >= 5
        monkeypatch.setattr(Scheduler, "step", step)  # the model at its speed again: the next answers as alone
        monkeypatch.setattr(Generator, "stream_tokens", stream_tokens)
        fresh = mixed_bodies()[:12]
        together, alone = together_then_alone(server.url, fresh)
        assert all(close(a, b) for a, b in zip(together, alone))
        assert_idle(server)
