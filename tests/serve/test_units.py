"""The pieces without a server: stop strings, chat templates, the slot pool, the config."""

from __future__ import annotations

import asyncio
import json

import pytest

from specrt.core.errors import BundleError, InvalidArgument
from specrt.runtime.chat_template import ChatFormatter, plain_template
from specrt.serve.config import ServeConfig
from specrt.serve.slots import AdmissionQueue, QueueFull
from specrt.core.tokenizer import StopText

LLAMA3_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("pieces, stops, emitted, hit", [
    (["hello wor", "ld"], ["world"], "hello ", True),
    (["ab", "c", "d"], ["cd"], "ab", True),
    (["a", "b", "c"], ["x"], "abc", False),
    (["one\n", "\ntwo"], ["\n\n"], "one", True),
    (["wo", "w"], ["world"], "wow", False),  # a held-back prefix that did not become a stop is released
    (["xy", "z!"], ["z!", "yz"], "x", True),  # the earliest stop wins
])
def test_stop_text(pieces, stops, emitted, hit):
    st = StopText(stops)
    out, found = "", False
    for p in pieces:
        text, found = st.push(p)
        out += text
        if found:
            break
    if not found:
        out += st.flush()
    assert (out, found) == (emitted, hit)


def test_plain_template():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert plain_template(msgs) == "system: Be brief.\nuser: Hi\nassistant: "
    assert ChatFormatter().render(msgs) == (plain_template(msgs), True)
    with pytest.raises(InvalidArgument):
        ChatFormatter().render([])


def test_checkpoint_template(tmp_path):
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": LLAMA3_LIKE, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    fmt = ChatFormatter.from_tokenizer_config(cfg)
    assert fmt.kind == "checkpoint"
    text, add_special = fmt.render([{"role": "user", "content": " Hi "}])
    assert text == "<s><|start|>user\nHi<|end|><|start|>assistant\n" and add_special is False
    named = tmp_path / "named.json"
    named.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"},
                                                   {"name": "default", "template": "D{{ messages|length }}"}]}))
    assert ChatFormatter.from_tokenizer_config(named).render([{"role": "user", "content": "x"}])[0] == "D1"
    none = tmp_path / "none.json"
    none.write_text(json.dumps({"bos_token": "<s>"}))
    assert ChatFormatter.from_tokenizer_config(none).kind == "plain"
    assert ChatFormatter.from_tokenizer_config(None).kind == "plain"


def test_template_errors(tmp_path):
    strict = ChatFormatter("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok")
    with pytest.raises(InvalidArgument, match="user first"):
        strict.render([{"role": "system", "content": "x"}])
    with pytest.raises(BundleError):
        ChatFormatter("{% for %}")
    sandboxed = ChatFormatter("{{ messages.__class__.__mro__ }}")  # the sandbox refuses attribute tricks
    with pytest.raises(Exception):
        sandboxed.render([{"role": "user", "content": "x"}])


def test_admission_queue_fifo_and_queue_limit():
    async def main():
        pool = AdmissionQueue(["g0"], max_queue=2)
        assert await pool.acquire() == "g0" and pool.busy == 1
        waiters = [asyncio.ensure_future(pool.acquire()) for _ in range(2)]
        await asyncio.sleep(0)  # let both reach the queue
        assert pool.waiting == 2
        with pytest.raises(QueueFull):
            await pool.acquire()
        pool.release("g0")
        assert await asyncio.wait_for(waiters[0], 5) == "g0" and not waiters[1].done()
        waiters[1].cancel()  # a waiter that leaves frees its queue place
        await asyncio.gather(waiters[1], return_exceptions=True)
        assert pool.waiting == 0
        pool.release("g0")
        assert pool.busy == 0

    asyncio.run(main())


@pytest.mark.parametrize("kwargs", [{"served_model_name": ""}, {"max_queue": -1}, {"method": "eagle"},
                                    {"num_speculative_tokens": -2}, {"num_speculative_tokens": "many"},
                                    {"max_body_bytes": 10}, {"api_key": "  "}])
def test_config_validation(kwargs):
    with pytest.raises(InvalidArgument):
        ServeConfig(**{"served_model_name": "m", **kwargs})
