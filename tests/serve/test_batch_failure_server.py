"""A served request whose part of a batched step fails (here its proposer raises) is answered with 500 and its
error; the requests batched with it get their answers, and the server serves on (runtime/batch/failures.py,
docs/safety.md §4)."""

from __future__ import annotations

import asyncio
import time

from serve_helpers import serving

PROMPTS = ["import json\n", "def load(path):\n", "class Parser:\n    "]
POISON = "zebra poison"


def test_a_failing_request_gets_500_and_the_batch_its_answers(target_only_bundle, monkeypatch):
    import openai

    from specrt.runtime import load
    from specrt.runtime.batch.scheduler import Scheduler
    from specrt.runtime.proposers import auto

    gen = load(target_only_bundle, backend="ort")
    refs = {p: gen.generate(p, 10, temperature=0, method="none").text for p in PROMPTS}
    first = gen.tokenizer.encode(POISON)[0]
    assert all(gen.tokenizer.encode(p)[0] != first for p in PROMPTS)
    real = auto.AutoProposer.observe

    def observe(self, n, *args):  # the poisoned request's proposer fails 6 tokens in, the others then beside it
        if int(self._tokens[0]) == first and n >= len(gen.tokenizer.encode(POISON)) + 6:
            raise RuntimeError("proposer bug")
        return real(self, n, *args)

    step = Scheduler.step  # steps of 20 ms at least (a slow model): the four requests overlap
    monkeypatch.setattr(Scheduler, "step", lambda self: (time.sleep(0.02), step(self))[1])
    monkeypatch.setattr(auto.AutoProposer, "observe", observe)
    with serving(str(target_only_bundle), max_batch=4, method="auto", num_speculative_tokens="auto",
                 served_model_name="tiny", backend="ort") as server:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)

        async def one(p: str):
            try:
                r = await client.completions.create(model="tiny", prompt=p, max_tokens=10, temperature=0)
            except openai.APIStatusError as exc:
                return exc
            return r.choices[0].text

        async def main(prompts):
            try:
                return await asyncio.gather(*(one(p) for p in prompts))
            finally:
                await client.close()

        failed, *texts = asyncio.run(main([POISON, *PROMPTS]))
        assert isinstance(failed, openai.APIStatusError) and failed.status_code == 500
        assert "proposer bug" in str(failed)
        assert texts == [refs[p] for p in PROMPTS]
        sync = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        again = sync.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=10, temperature=0)
        assert again.choices[0].text == refs[PROMPTS[0]]
