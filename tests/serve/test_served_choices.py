"""n > 1 and several prompts per /v1/completions through the official client: each choice equals specrt's own
generation of the same request (greedy; sampled with seed + i), on slots and on the batch (--max-batch)."""

from __future__ import annotations

import collections

import openai
import pytest

from serve_helpers import K, metric, serving, openai_client

PROMPT = "def main(args):\n    "
OTHER = "import os\n"
SPEC = {"method": "draft", "num_speculative_tokens": K}


def ref(gen, prompt, n_tokens, **kw):
    return gen.generate(prompt, n_tokens, **{"method": "draft", "num_speculative_tokens": K, **kw})


def test_greedy_n_gives_n_identical_choices(client, pair_generator):
    want = ref(pair_generator, PROMPT, 12, temperature=0)
    resp = client.completions.create(model="tiny", prompt=PROMPT, n=3, max_tokens=12, temperature=0)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert [c.text for c in resp.choices] == [want.text] * 3
    assert all(c.finish_reason == want.finish_reason for c in resp.choices)
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)
    assert resp.usage.completion_tokens == 3 * len(want.token_ids)


def test_seeded_n_choices_are_the_requests_with_seed_plus_i(client, pair_generator):
    wants = [ref(pair_generator, PROMPT, 10, temperature=1.0, seed=41 + i).text for i in range(3)]
    assert len(set(wants)) > 1  # the seeds differ, so do the samples
    resp = client.completions.create(model="tiny", prompt=PROMPT, n=3, max_tokens=10, temperature=1.0, seed=41,
                                      extra_body={"speculative": SPEC})
    assert [c.text for c in resp.choices] == wants
    again = client.completions.create(model="tiny", prompt=PROMPT, n=3, max_tokens=10, temperature=1.0, seed=41,
                                      extra_body={"speculative": SPEC})
    assert [c.text for c in again.choices] == wants  # reproducible
    one = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=1.0, seed=41,
                                      extra_body={"speculative": SPEC})
    assert one.choices[0].text == wants[0]  # choice 0 is the request with n = 1


def test_several_prompts_one_choice_each_in_order(client, pair_generator):
    wants = [ref(pair_generator, p, 8, temperature=0) for p in (PROMPT, OTHER)]
    resp = client.completions.create(model="tiny", prompt=[PROMPT, OTHER], n=2, max_tokens=8, temperature=0)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]  # prompt index x n + choice
    assert [c.text for c in resp.choices] == [wants[0].text] * 2 + [wants[1].text] * 2
    assert resp.usage.prompt_tokens == sum(len(w.prompt_token_ids) for w in wants)
    assert resp.usage.completion_tokens == 2 * sum(len(w.token_ids) for w in wants)
    ids = [pair_generator.tokenizer.encode(p) for p in (PROMPT, OTHER)]
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    assert [c.text for c in by_ids.choices] == [w.text for w in wants]


def test_streamed_choices_carry_their_index(client, pair_generator):
    wants = [ref(pair_generator, p, 10, temperature=0.8, seed=7 + i).text for p in (PROMPT, OTHER) for i in range(2)]
    texts, finishes = collections.defaultdict(str), collections.Counter()
    chunks = list(client.completions.create(model="tiny", prompt=[PROMPT, OTHER], n=2, max_tokens=10, seed=7,
                                            temperature=0.8, stream=True, stream_options={"include_usage": True},
                                            extra_body={"speculative": SPEC}))
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.text
            finishes[c.index] += c.finish_reason is not None
    assert [texts[i] for i in range(4)] == wants
    assert finishes == {0: 1, 1: 1, 2: 1, 3: 1}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_chat_n_streamed_equals_not_streamed(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "import os"}], n=2, max_tokens=8, temperature=1.0,
              seed=3)
    resp = client.chat.completions.create(**kw)
    texts = collections.defaultdict(str)
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert [c.message.content for c in resp.choices] == [texts[0], texts[1]]
    assert resp.choices[0].message.content != resp.choices[1].message.content


def test_best_of_is_refused(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=PROMPT, n=2, best_of=3, max_tokens=4)
    assert info.value.body["param"] == "best_of"


def test_choices_decode_together_on_the_batch(pair_bundle, pair_generator):
    """--max-batch 4: n seeded choices and several prompts run as rows of one batch; same text as alone."""
    spec = {"method": "ngram", "num_speculative_tokens": K}
    wants = [pair_generator.generate(PROMPT, 10, temperature=1.0, seed=5 + i, **spec).text for i in range(3)]
    greedy = [pair_generator.generate(p, 10, temperature=0, **spec).text for p in (PROMPT, OTHER)]
    with serving(str(pair_bundle), max_batch=4, method="ngram", served_model_name="tiny", backend="ort") as srv:
        client = openai_client(srv)
        resp = client.completions.create(model="tiny", prompt=PROMPT, n=3, max_tokens=10, temperature=1.0, seed=5)
        assert [c.text for c in resp.choices] == wants
        resp = client.completions.create(model="tiny", prompt=[PROMPT, OTHER], max_tokens=10, temperature=0)
        assert [c.text for c in resp.choices] == greedy
        # long enough that the choices meet in the batch: the later ones copy the prompt's rows (one prefill)
        wants = [pair_generator.generate(PROMPT, 80, temperature=1.0, seed=9 + i, **spec).text for i in range(4)]
        resp = client.completions.create(model="tiny", prompt=PROMPT, n=4, max_tokens=80, temperature=1.0, seed=9)
        assert [c.text for c in resp.choices] == wants
        assert metric(srv, "specrt_shared_prompt_tokens") > 0


def test_a_client_leaving_a_stream_of_choices_frees_every_slot(server, client):
    from serve_helpers import metric, wait_until
    import httpx

    cancelled = metric(server, "specrt_request_finish_total", finish_reason="cancelled")
    # seeded (seed 0: all four choices run their 100 tokens; unseeded, 2 of ~160 sampled choices ended by EOS within
    # two tokens here, and choices that end before the client leaves are not cancelled)
    stream = client.completions.create(model="tiny", prompt=PROMPT, n=4, max_tokens=100, temperature=1.0, seed=0,
                                       stream=True)
    next(iter(stream))
    stream.close()
    wait_until(lambda: httpx.get(f"{server.url}/health", timeout=10).json()["busy"] == 0, 30, "free slots")
    # the choices running when it left were stopped, not decoded to the end for nobody
    wait_until(lambda: metric(server, "specrt_request_finish_total", finish_reason="cancelled") > cancelled, 30,
               "cancelled choices")
    assert client.completions.create(model="tiny", prompt=PROMPT, n=2, max_tokens=4, temperature=0).choices
