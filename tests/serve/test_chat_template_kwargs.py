"""`chat_template_kwargs` (vLLM's extension): more variables for the checkpoint's chat template, e.g. Qwen3's
`enable_thinking`; the reserved names and wrong types are 400s."""

from __future__ import annotations

import httpx
import pytest

from serve_helpers import openai_client, serving

USER = [{"role": "user", "content": "hi"}]
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: "
            "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")


@pytest.fixture(scope="module")
def kw_server(slot_generators):
    with serving(slot_generators, chat_template=TEMPLATE, served_model_name="tiny", num_speculative_tokens=3) as srv:
        yield srv


@pytest.mark.parametrize("kwargs, rendered", [
    (None, "user: hi\nassistant: "),
    ({"enable_thinking": True}, "user: hi\nassistant: "),
    ({"enable_thinking": False}, "user: hi\nassistant: <think></think>"),
])
def test_the_template_sees_the_variables(kw_server, pair_generator, kwargs, rendered):
    client = openai_client(kw_server)
    extra = {"chat_template_kwargs": kwargs} if kwargs is not None else {}
    resp = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0, extra_body=extra)
    want = pair_generator.generate(pair_generator.tokenizer.encode(rendered, add_special_tokens=False), 8,
                                   method="none", temperature=0)
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)
    assert resp.choices[0].message.content == want.text


@pytest.mark.parametrize("value", [{"messages": []}, {"bos_token": "x"}, ["enable_thinking"], {"x": "\ud800"}])
def test_reserved_names_and_wrong_types_are_400(kw_server, value):
    import json

    body = json.dumps({"model": "tiny", "messages": USER, "max_tokens": 2, "chat_template_kwargs": value})
    r = httpx.post(f"{kw_server.url}/v1/chat/completions", content=body.encode(), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("chat_template_kwargs")
