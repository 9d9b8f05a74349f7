"""The OpenAI API through the official client: same greedy text as Generator.generate, streaming or not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serve_helpers import K

PROMPT = "def main(args):\n    "
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "import os"}]


def expected(gen, prompt, n, **kw):
    kw.setdefault("method", "draft")
    kw.setdefault("num_speculative_tokens", K)
    return gen.generate(prompt, n, temperature=0, **kw)


def test_completion_matches_generate(client, pair_generator):
    ref = expected(pair_generator, PROMPT, 20)
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0,
                                     extra_body={"speculative": {"method": "draft"}})  # stats compared with draft's
    choice = resp.choices[0]
    assert choice.text == ref.text
    assert choice.finish_reason == ref.finish_reason
    assert resp.object == "text_completion" and resp.model == "tiny"
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert resp.usage.completion_tokens == len(ref.token_ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    stats = resp.model_extra["speculative_stats"]
    assert stats["method"] == "draft"
    assert stats["num_speculative_tokens"] == ref.stats.num_speculative_tokens  # the last step's k
    assert stats["verify_steps"] == ref.stats.verify_steps
    assert stats["drafted_tokens"] == ref.stats.drafted_tokens > 0
    assert stats["accepted_tokens"] == ref.stats.accepted_tokens
    assert stats["acceptance_rate"] == pytest.approx(ref.stats.acceptance_rate)
    assert stats["mean_accepted_tokens"] == pytest.approx(ref.stats.mean_accepted_tokens)


def test_completion_default_max_tokens_is_16(client, pair_generator):
    resp = client.completions.create(model="tiny", prompt=PROMPT, temperature=0)
    assert resp.usage.completion_tokens == len(expected(pair_generator, PROMPT, 16).token_ids)


@pytest.mark.parametrize("spec", [{"method": "none"}, {"method": "draft", "num_speculative_tokens": 0},
                                  {"method": "draft", "num_speculative_tokens": 8},
                                  {"method": "hybrid", "num_speculative_tokens": 4}])
def test_speculative_extra_field(client, pair_generator, spec):
    ref = expected(pair_generator, PROMPT, 24)
    same = expected(pair_generator, PROMPT, 24, **spec)
    resp = client.completions.create(model="tiny", prompt=[PROMPT], max_tokens=24, temperature=0,
                                     extra_body={"speculative": spec})
    assert resp.choices[0].text == ref.text  # lossless: the same greedy text whatever the speculation
    stats = resp.model_extra["speculative_stats"]
    assert stats["method"] == spec["method"]
    assert stats["drafted_tokens"] == same.stats.drafted_tokens
    assert stats["num_speculative_tokens"] == same.stats.num_speculative_tokens
    if spec["method"] == "none" or spec["num_speculative_tokens"] == 0:
        assert stats["drafted_tokens"] == 0


def test_token_id_prompt(client, pair_generator):
    ids = pair_generator.tokenizer.encode(PROMPT)
    resp = client.completions.create(model="tiny", prompt=ids, max_tokens=10, temperature=0)
    assert resp.choices[0].text == expected(pair_generator, PROMPT, 10).text


def test_completion_stream_matches(client, pair_generator):
    ref = expected(pair_generator, PROMPT, 30)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"speculative": {"method": "draft"}}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == ref.finish_reason
    assert finals[0].model_extra["speculative_stats"]["drafted_tokens"] == ref.stats.drafted_tokens
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert all("usage" in c.model_fields_set and c.usage is None for c in chunks[:-1])  # null until the last, as OpenAI
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # really incremental


def test_chat_matches_plain_template(client, pair_generator):
    from specrt.runtime.chat_template import plain_template

    ref = expected(pair_generator, plain_template(MESSAGES), 25)
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=25, temperature=0)
    msg = resp.choices[0].message
    assert msg.role == "assistant" and msg.content == ref.text
    assert resp.object == "chat.completion"
    assert resp.usage.completion_tokens == len(ref.token_ids)
    assert resp.model_extra["speculative_stats"]["method"] == "auto"  # the default (#51)


def test_chat_stream_matches(client, pair_generator):
    from specrt.runtime.chat_template import plain_template

    ref = expected(pair_generator, plain_template(MESSAGES), 25)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=25, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason
    assert chunks[-1].object == "chat.completion.chunk"


def test_chat_default_max_tokens_fills_context(client, pair_generator):
    from specrt.runtime.chat_template import plain_template

    prompt_len = len(pair_generator.encode_prompt(plain_template(MESSAGES)))
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0)
    ref = expected(pair_generator, plain_template(MESSAGES), 128 - prompt_len)
    assert resp.choices[0].message.content == ref.text
    assert resp.usage.total_tokens <= 128


def test_stop_strings(client, pair_generator):
    ref = expected(pair_generator, PROMPT, 30)
    stop = ref.text[5:8]  # a string the greedy output is known to contain
    cut = ref.text[:ref.text.find(stop)]
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0, stop=stop)
    assert resp.choices[0].text == cut and resp.choices[0].finish_reason == "stop"
    chunks = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0,
                                       stop=["\x00never", stop], stream=True)
    pieces = [c.choices[0] for c in chunks]
    assert "".join(p.text for p in pieces) == cut and pieces[-1].finish_reason == "stop"


def test_sampling_is_seeded(client):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0.9, top_p=0.9, seed=7)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text


def test_models_and_health(client, server):
    import httpx

    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].model_extra["max_model_len"] == 128
    health = httpx.get(f"{server.url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["slots"] == 2 and health["busy"] == 0


def test_same_as_generate_cli(client, pair_bundle):
    exe = Path(sys.executable).with_name("specrt")  # the console script installed with the package
    out = subprocess.run([str(exe), "generate", str(pair_bundle), "--prompt", PROMPT,
                          "--max-new-tokens", "15", "--num-speculative-tokens", str(K), "--method", "draft",
                          "--backend", "ort", "--threads", "1", "--json"],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    cli = json.loads(out.stdout)
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=15, temperature=0)
    assert resp.choices[0].text == cli["text"]
    assert resp.usage.completion_tokens == len(cli["token_ids"])


def test_chat_with_checkpoint_template(server, client, pair_generator):
    from specrt.runtime.chat_template import ChatFormatter

    service = server.server.config.app.state.service
    fmt = ChatFormatter("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}")
    text, _ = fmt.render(MESSAGES)
    assert text == "<system>You write Python.<user>import os<assistant>"
    ids = pair_generator.tokenizer.encode(text, add_special_tokens=False)
    ref = pair_generator.generate(ids, 12, temperature=0, method="draft", num_speculative_tokens=K)
    saved, service.chat = service.chat, fmt
    try:
        resp = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    finally:
        service.chat = saved
    assert resp.choices[0].message.content == ref.text
    assert resp.usage.prompt_tokens == len(ids)


def test_chat_template_over_its_bound_is_a_400(server, client):
    import openai

    from specrt.runtime.chat_template import ChatFormatter
    from specrt.runtime.template_bounds import RenderBounds

    service = server.server.config.app.state.service
    hostile = ChatFormatter("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                            bounds=RenderBounds(max_seconds=0.3))
    saved, service.chat = service.chat, hostile
    try:
        with pytest.raises(openai.BadRequestError, match="chat template ran longer"):
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0)
    finally:
        service.chat = saved
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0)
    assert resp.usage.completion_tokens == 4  # the server still answers
