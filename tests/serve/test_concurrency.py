"""Slots and the wait queue: 32 concurrent requests, 429 on overload, disconnects free their slot."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serve_helpers import K, Gated, metric, openai_client, serving, wait_until

PROMPTS = ["import json\n", "def load(path):\n", "class Parser:\n    ", "    return os.path."]


def test_32_concurrent_requests(server, pair_generator):
    import openai

    refs = {p: pair_generator.generate(p, 12, temperature=0, method="draft", num_speculative_tokens=K).text
            for p in PROMPTS}
    aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(i: int) -> tuple[str, str]:
        prompt = PROMPTS[i % len(PROMPTS)]
        if i % 2:  # half streaming, half not
            stream = await aclient.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                                      stream=True)
            return prompt, "".join([c.choices[0].text async for c in stream])
        resp = await aclient.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        return prompt, resp.choices[0].text

    async def main():
        import asyncio

        try:
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(32))), timeout=120)
        finally:
            await aclient.close()

    import asyncio

    before = metric(server, "specrt_requests_total", endpoint="/v1/completions", status="200")
    results = asyncio.run(main())
    assert len(results) == 32
    for prompt, text in results:
        assert text == refs[prompt]
    assert metric(server, "specrt_requests_total", endpoint="/v1/completions", status="200") == before + 32
    assert metric(server, "specrt_running_requests") == 0 and metric(server, "specrt_queue_depth") == 0


def _stream_body(max_tokens: int = 8) -> dict:
    return {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": max_tokens, "temperature": 0, "stream": True}


def test_overload_gives_429_with_retry_after(slot_generators):
    gated = Gated(slot_generators[0])
    gated.gate.clear()  # the model makes no progress until the test says so
    with serving([gated], max_queue=1, served_model_name="tiny") as srv:
        results: dict[str, httpx.Response] = {}

        def fire(name: str) -> None:
            with httpx.Client(timeout=60) as c:
                r = c.post(f"{srv.url}/v1/completions", json=_stream_body())
                r.read()
                results[name] = r

        health = lambda: httpx.get(f"{srv.url}/health", timeout=10).json()  # noqa: E731
        threads = [threading.Thread(target=fire, args=("running",))]
        threads[0].start()
        wait_until(lambda: health()["busy"] == 1, what="the first request to take the slot")
        threads.append(threading.Thread(target=fire, args=("queued",)))
        threads[1].start()
        wait_until(lambda: health()["queued"] == 1, what="the second request to wait in the queue")
        try:
            with ThreadPoolExecutor(4) as pool:  # several more at once: the queue is full
                rejected = list(pool.map(lambda _: httpx.post(f"{srv.url}/v1/completions", json=_stream_body(),
                                                              timeout=30), range(4)))
            for r in rejected:
                assert r.status_code == 429
                assert int(r.headers["retry-after"]) >= 1
                err = r.json()["error"]
                assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
            import openai

            with pytest.raises(openai.RateLimitError):
                openai_client(srv).completions.create(model="tiny", prompt="x", max_tokens=2)
            assert metric(srv, "specrt_queue_depth") == 1 and metric(srv, "specrt_running_requests") == 1
            assert metric(srv, "specrt_requests_total", endpoint="/v1/completions", status="429") == 5
        finally:
            gated.gate.set()
            for t in threads:
                t.join(timeout=60)
        assert results["running"].status_code == results["queued"].status_code == 200
        assert results["queued"].text.endswith("data: [DONE]\n\n")
        assert health() == {**health(), "busy": 0, "queued": 0}


def test_disconnect_mid_stream_frees_the_slot(slot_generators):
    slow = Gated(slot_generators[0], delay=0.02)  # >= 2 s for the 100 tokens asked below
    with serving([slow], max_queue=4, served_model_name="tiny") as srv:
        body = {**_stream_body(100), "speculative": {"method": "none"}}
        with httpx.Client(timeout=30) as c:
            with c.stream("POST", f"{srv.url}/v1/completions", json=body) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        break  # one chunk read; leaving the block closes the connection
        wait_until(lambda: metric(srv, "specrt_requests_cancelled_total", endpoint="/v1/completions") == 1,
                   what="the server to cancel the departed stream")
        wait_until(lambda: metric(srv, "specrt_running_requests") == 0, what="the slot to be free")
        assert metric(srv, "specrt_request_finish_total", finish_reason="cancelled") == 1
        assert metric(srv, "specrt_generation_tokens_total") < 100  # it really stopped early

        # a new request gets the slot at once and completes
        slow.delay = 0.0
        resp = openai_client(srv, timeout=10).completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=5,
                                                                 temperature=0)
        assert resp.usage.completion_tokens == 5


def test_disconnect_while_waiting_non_streaming(slot_generators):
    slow = Gated(slot_generators[0], delay=0.02)
    with serving([slow], max_queue=4, served_model_name="tiny") as srv:
        body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 100, "temperature": 0,
                "speculative": {"method": "none"}}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up after 0.3 s and closes the connection
            httpx.post(f"{srv.url}/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.3))
        wait_until(lambda: metric(srv, "specrt_requests_cancelled_total", endpoint="/v1/completions") == 1,
                   what="the server to cancel the departed request")
        wait_until(lambda: metric(srv, "specrt_running_requests") == 0, what="the slot to be free")
        assert metric(srv, "specrt_generation_tokens_total") < 100


def test_back_to_back_requests_never_see_their_own_slot_busy(slot_generators):
    with serving(slot_generators[:1], max_queue=0, served_model_name="tiny") as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as c:  # one keep-alive connection, no pause between
            for i in range(12):
                body = {"model": "tiny", "prompt": PROMPTS[i % 4], "max_tokens": 3, "stream": bool(i % 2)}
                assert c.post("/v1/completions", json=body).status_code == 200
