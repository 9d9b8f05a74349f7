"""logprobs, penalties and logit_bias through the official openai client against a loopback server (#53)."""

from __future__ import annotations

import math

import httpx
import pytest

PROMPT = "def main(args):\n    "
MESSAGES = [{"role": "user", "content": "import os"}]
SPEC = {"speculative": {"method": "draft", "num_speculative_tokens": 3}}
PLAIN = {"speculative": {"method": "none"}}


def test_completion_logprobs_match_generate_and_plain(client, pair_generator):
    ref = pair_generator.generate(PROMPT, 12, temperature=0, method="none", logprobs=3)
    out = {}
    for name, extra in (("spec", SPEC), ("plain", PLAIN)):
        resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3,
                                         extra_body=extra)
        out[name] = resp.choices[0]
    lp = out["spec"].logprobs
    assert len(lp.tokens) == len(ref.token_ids) == 12
    assert lp.tokens == [pair_generator.tokenizer.decode([t], skip_special_tokens=False) for t in ref.token_ids]
    assert lp.token_logprobs == pytest.approx([t.logprob for t in ref.logprobs], abs=1e-4)
    assert lp.token_logprobs == pytest.approx(out["plain"].logprobs.token_logprobs, abs=1e-4)
    assert all(len(top) <= 3 and max(top.values()) == pytest.approx(p, abs=1e-6)
               for top, p in zip(lp.top_logprobs, lp.token_logprobs))  # greedy: the token is the top one
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_streamed_per_chunk_equal_the_whole(client):
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2,
              extra_body=SPEC)
    whole = client.chat.completions.create(**kw).choices[0]
    items = whole.logprobs.content
    assert len(items) == 10  # (a piece of a multi-byte character is a U+FFFD token string: no join check)
    for i in items:
        assert i.logprob <= 0 and len(i.top_logprobs) == 2 and i.bytes == list(i.token.encode())
        assert i.top_logprobs[0].logprob == pytest.approx(i.logprob)
    streamed = [c.choices[0].logprobs for c in client.chat.completions.create(stream=True, **kw)
                if c.choices and c.choices[0].logprobs is not None]
    assert len(streamed) > 1  # chunk by chunk, not once at the end
    flat = [i for lp in streamed for i in lp.content]
    assert [i.token for i in flat] == [i.token for i in items]
    assert [i.logprob for i in flat] == pytest.approx([i.logprob for i in items], abs=1e-6)


@pytest.mark.parametrize("field, value", [("presence_penalty", 1.5), ("frequency_penalty", 1.0),
                                          ("repetition_penalty", 1.8)])
def test_penalties_equal_generate_and_plain(client, pair_generator, field, value):
    ref = pair_generator.generate(PROMPT, 24, temperature=0, method="none", **{field: value})
    free = pair_generator.generate(PROMPT, 24, temperature=0, method="none")
    assert ref.token_ids != free.token_ids, "the penalty must change this output for the test to see it"
    for extra in (SPEC, PLAIN):
        resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0,
                                         extra_body={field: value, **extra} if field == "repetition_penalty"
                                         else extra, **({} if field == "repetition_penalty" else {field: value}))
        assert resp.choices[0].text == ref.text


def test_logit_bias_bans_a_token(client, pair_generator):
    free = pair_generator.generate(PROMPT, 12, temperature=0, method="none")
    bias = {str(t): -100 for t in set(free.token_ids)}
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, logit_bias=bias,
                                     logprobs=0, extra_body=SPEC)
    ref = pair_generator.generate(PROMPT, 12, temperature=0, method="none", logit_bias=bias)
    assert resp.choices[0].text == ref.text
    assert not set(ref.token_ids) & set(free.token_ids)
    assert all(math.isfinite(p) for p in resp.choices[0].logprobs.token_logprobs)


def test_top_logprobs_needs_logprobs_and_stays_in_range(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
    for extra, param in (({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21},
                                                                  "top_logprobs")):
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body | extra, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_with_max_batch_such_requests_run_beside_the_batch(pair_bundle, pair_generator):
    """--max-batch: a request with a penalty and logprobs runs on the one-request loop and equals generate."""
    from serve_helpers import openai_client, serving

    ref = pair_generator.generate(PROMPT, 12, temperature=0, method="none", frequency_penalty=1.0, logprobs=1)
    assert ref.token_ids != pair_generator.generate(PROMPT, 12, temperature=0, method="none").token_ids
    with serving(str(pair_bundle), max_batch=2, method="draft", served_model_name="tiny", backend="ort") as srv:
        client = openai_client(srv)
        resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                         frequency_penalty=1.0, logprobs=1)
        assert srv.server.config.app.state.engine is not None  # the server does batch
    assert resp.choices[0].text == ref.text
    assert resp.choices[0].logprobs.token_logprobs == pytest.approx([t.logprob for t in ref.logprobs], abs=1e-4)


def _ref_logprobs(gen, prompt, n_tokens, **kw):
    ref = gen.generate(prompt, n_tokens, method="draft", num_speculative_tokens=3, logprobs=2, **kw)
    tokens = [gen.tokenizer.decode([t], skip_special_tokens=False) for t in ref.token_ids]
    return tokens, [t.logprob for t in ref.logprobs]


def test_every_choice_of_n_and_of_several_prompts_has_its_logprobs(client, pair_generator):
    """n > 1 and several prompts: each choice carries its own sequence's logprobs (they were null)."""
    wants = [_ref_logprobs(pair_generator, PROMPT, 8, temperature=1.0, seed=5 + i) for i in range(2)]
    assert wants[0] != wants[1]  # two seeds, two samples: each choice must get its own
    resp = client.completions.create(model="tiny", prompt=PROMPT, n=2, max_tokens=8, temperature=1.0, seed=5,
                                     logprobs=2, extra_body=SPEC)
    for choice, (tokens, logprobs) in zip(resp.choices, wants, strict=True):
        assert choice.logprobs.tokens == tokens
        assert choice.logprobs.token_logprobs == pytest.approx(logprobs, abs=1e-4)
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    other = "import os\n"
    wants = [_ref_logprobs(pair_generator, p, 6, temperature=0) for p in (PROMPT, other)]
    resp = client.completions.create(model="tiny", prompt=[PROMPT, other], n=2, max_tokens=6, temperature=0,
                                     logprobs=2, extra_body=SPEC)
    for choice, (tokens, logprobs) in zip(resp.choices, [wants[0]] * 2 + [wants[1]] * 2, strict=True):
        assert choice.logprobs.tokens == tokens  # greedy copies of one sequence: the same entries
        assert choice.logprobs.token_logprobs == pytest.approx(logprobs, abs=1e-4)
        assert choice.logprobs.text_offset[0] == 0


def test_streamed_choices_carry_their_logprobs(client):
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0.9, seed=3, n=2, logprobs=True,
              top_logprobs=1, extra_body=SPEC)
    whole = client.chat.completions.create(**kw).choices
    assert [len(c.logprobs.content) for c in whole] == [8, 8]
    streamed: dict[int, list] = {0: [], 1: []}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed[c.index] += c.logprobs.content
    for c in whole:
        assert [i.token for i in streamed[c.index]] == [i.token for i in c.logprobs.content]
        assert [i.logprob for i in streamed[c.index]] == pytest.approx([i.logprob for i in c.logprobs.content])
