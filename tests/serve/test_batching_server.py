"""`create_app(bundle, max_batch=N)`: concurrent HTTP clients decode as one batch on one loaded model; every
answer equals the request's answer alone; /metrics shows the batch; a client that leaves frees its slot."""

from __future__ import annotations

import asyncio

import httpx

from conftest import metric, serving, wait_until

PROMPTS = ["import json\n", "def load(path):\n", "class Parser:\n    ", "    return os.path.", "x = [1, 2, 3]\n",
           "for i in range(10):\n", "# a comment\n", "print("]


def test_concurrent_clients_share_one_batch(pair_bundle, pair_generator):
    import openai

    refs = {p: pair_generator.generate(p, 10, temperature=0, method="ngram").text for p in PROMPTS}
    with serving(str(pair_bundle), max_batch=4, method="ngram", num_speculative_tokens="auto",
                 served_model_name="tiny", backend="ort") as server:
        assert metric(server, "specrt_batch_max") == 4
        assert metric(server, "specrt_slots") == 4
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)

        async def one(i: int) -> tuple[str, str]:
            p = PROMPTS[i % len(PROMPTS)]
            r = await client.completions.create(model="tiny", prompt=p, max_tokens=10, temperature=0)
            return p, r.choices[0].text

        async def main():
            try:
                return await asyncio.gather(*(one(i) for i in range(12)))
            finally:
                await client.close()

        for p, text in asyncio.run(main()):
            assert text == refs[p], p
        assert metric(server, "specrt_goodput_tokens_per_second") > 0
        # a streaming client that leaves: its slot is free again
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": "hello", "max_tokens": 100, "stream": True}) as resp:
            for _ in resp.iter_lines():
                break
        wait_until(lambda: metric(server, "specrt_batch_size") == 0, 20, "the batch to empty")
