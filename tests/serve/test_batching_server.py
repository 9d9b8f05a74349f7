"""`create_app(bundle, max_batch=N)`: concurrent HTTP clients decode as one batch on one loaded model; every
answer equals the request's answer alone; /metrics shows the batch; a client that leaves frees its slot."""

from __future__ import annotations

import asyncio

import httpx

from serve_helpers import hold_the_batch, metric, serving, wait_until

PROMPTS = ["import json\n", "def load(path):\n", "class Parser:\n    ", "    return os.path.", "x = [1, 2, 3]\n",
           "for i in range(10):\n", "# a comment\n", "print("]


def test_concurrent_clients_share_one_batch(pair_bundle, pair_generator):
    import openai

    refs = {p: pair_generator.generate(p, 10, temperature=0, method="ngram").text for p in PROMPTS}
    with serving(str(pair_bundle), max_batch=4, method="ngram", num_speculative_tokens="auto",
                 served_model_name="tiny", backend="ort") as server:
        assert metric(server, "specrt_batch_max") == 4
        assert metric(server, "specrt_packed_pass") == 1
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


def test_requests_waiting_for_a_slot_count_as_vllm_counts_them(pair_bundle, monkeypatch):
    # vllm:num_requests_waiting: every request not yet running, here the ones in the server's queue (beyond
    # --max-batch), not only those inside the scheduler. The batch is held with two requests running until the
    # test releases it (before: steps slowed to 20 ms, which the four clients had to outrun on a loaded machine).
    import threading

    with serving(str(pair_bundle), max_batch=2, method="none", served_model_name="tiny", backend="ort") as server:
        release = hold_the_batch(monkeypatch, 2)

        def one(i):
            httpx.post(f"{server.url}/v1/completions", timeout=120,
                       json={"model": "tiny", "prompt": PROMPTS[i], "max_tokens": 40, "temperature": 0})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        try:
            for t in threads:
                t.start()
            waiting = wait_until(lambda: metric(server, "vllm:num_requests_waiting") >= 2
                                 and metric(server, "specrt_queue_depth"), 30, "two requests waiting")
            assert waiting == 2 and metric(server, "vllm:num_requests_running") == 2
        finally:
            release.set()
            for t in threads:
                t.join()
        assert metric(server, "vllm:num_requests_waiting") == 0


def test_max_batch_auto_batches_where_the_bundle_can_and_falls_back_where_it_cannot(pair_bundle, pair_generator,
                                                                                     monkeypatch):
    import os

    from specrt.serve import create_app
    from specrt.serve.batching import AUTO_MAX, AUTO_SLOTS_PER_CORE, auto_max_batch

    app = create_app(str(pair_bundle), max_batch="auto", backend="ort")
    try:
        engine = app.state.engine
        assert engine is not None
        assert engine.max_batch == auto_max_batch(engine.gen)
        assert 1 <= engine.max_batch <= min(AUTO_MAX, AUTO_SLOTS_PER_CORE * os.cpu_count())
        assert app.state.service.pool.size == engine.max_batch
    finally:
        engine.close()
    # several generators asked for: auto means no batching
    app = create_app(str(pair_bundle), max_batch="auto", max_concurrency=2, backend="ort")
    assert app.state.engine is None and app.state.service.pool.size == 2
    # the portable graph: batches on its batch runner (runtime/batch/slots.py)
    from specrt.runtime.batch.slots import BatchRunnerPool

    app = create_app(str(pair_bundle), max_batch="auto", backend="ort-portable")
    try:
        assert isinstance(app.state.engine.scheduler.targets, BatchRunnerPool)
        assert app.state.engine.max_batch == auto_max_batch(app.state.engine.gen) >= 1
    finally:
        app.state.engine.close()
    # a portable graph without past_lengths (compiled before batched passes): one slot, no engine
    from specrt.bundle import graph_io

    monkeypatch.setattr(graph_io, "PAST_LENGTHS", "no_such_input")
    app = create_app(str(pair_bundle), max_batch="auto", backend="ort-portable")
    assert app.state.engine is None and app.state.service.pool.size == 1


def test_server_batches_on_a_batch_runner(workdir, llama_target):
    """`--backend ort-portable --max-batch 2`: the scheduler on the batched portable graph's batch runner (the code
    TensorRT's batch runner shares), every answer as alone on the same backend."""
    import openai

    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.runtime import load

    bundle = compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "serve_portable", max_seq_len=64,
                                        max_draft_tokens=4, ort_graph="both"))
    gen = load(bundle, backend="ort-portable", threads=1)
    refs = {p: gen.generate(p, 8, temperature=0, method="ngram").text for p in PROMPTS}
    with serving(str(bundle), max_batch=2, method="ngram", num_speculative_tokens="auto", served_model_name="tiny",
                 backend="ort-portable") as server:
        assert metric(server, "specrt_batch_max") == 2
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)

        async def one(p: str) -> tuple[str, str]:
            r = await client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0)
            return p, r.choices[0].text

        async def main():
            try:
                return await asyncio.gather(*(one(p) for p in PROMPTS))
            finally:
                await client.close()

        for p, text in asyncio.run(main()):
            assert text == refs[p], p
