"""Tool calls on /v1/chat/completions through the official client: forced calls decoded under the parameters schema
(the same tokens as specrt's constrained generation of the same prompt), tools and tool history rendered by the
template (or told in a system message where the template has no tools), auto parsed where the template defines a
format, and the 400s."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from serve_helpers import openai_client, serving

USER = [{"role": "user", "content": "hi"}]
PICK = {"type": "object", "additionalProperties": False, "required": ["tool"],
        "properties": {"tool": {"enum": ["grep", "sed"]}, "retries": {"type": "integer", "minimum": 0, "maximum": 9}}}
TOOLS = [{"type": "function", "function": {"name": "pick", "parameters": PICK}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {},
                                                                          "additionalProperties": False}}}]
# a template that renders tools (compactly: the toy bundle has 128 positions) and Hermes-style tool calls
TEMPLATE = ("{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\\n' }}{% endif %}"
            "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}"
            "</tool_call>{% endfor %}{{ '\\n' }}{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
            "assistant: ")


def ids_of(gen, text):
    return gen.tokenizer.encode(text, add_special_tokens=False)


def constrained(gen, text, schema, n):
    from specrt.runtime.constraint import ConstraintSpec

    return gen.generate(ids_of(gen, text), n, method="none", constraint=ConstraintSpec.json_schema(schema))


@pytest.fixture(scope="module")
def tool_server(slot_generators):
    """The pair bundle with a checkpoint template that renders tools (the bundle itself has none)."""
    with serving(slot_generators, chat_template=TEMPLATE, served_model_name="tiny", num_speculative_tokens=3) as srv:
        yield srv


@pytest.fixture(scope="module")
def tool_client(tool_server):
    return openai_client(tool_server)


def test_named_function_decoded_under_its_schema(tool_client, pair_generator):
    resp = tool_client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=30,
                                               tool_choice={"type": "function", "function": {"name": "pick"}})
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "pick" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), PICK)
    # the same tokens as specrt's constrained generation of the prompt the template renders (greedy by default: the
    # bundle's generation config has none, so the server's temperature 1 applies: compare at temperature 0)
    greedy = tool_client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=30, temperature=0,
                                                 tool_choice={"type": "function", "function": {"name": "pick"}})
    want = constrained(pair_generator, "tools: pick now\nuser: hi\nassistant: ", PICK, 30)
    assert greedy.choices[0].message.tool_calls[0].function.arguments == want.text
    assert greedy.usage.prompt_tokens == len(want.prompt_token_ids)
    assert greedy.model_extra["speculative_stats"]["forced_tokens"] > 0  # forced tokens drafted for free


@pytest.mark.parametrize("parallel", [True, False])
def test_required_returns_calls_of_the_tools(tool_client, pair_generator, parallel):
    from specrt.serve.tools import parse_tools
    from specrt.runtime.chat_template import ChatFormatter

    resp = tool_client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=parallel, max_tokens=90, temperature=0)
    choice = resp.choices[0]
    schema = parse_tools({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": parallel},
                         ChatFormatter(TEMPLATE)).schema()
    want = constrained(pair_generator, "tools: pick now\nuser: hi\nassistant: ", schema, 90)
    if want.finish_reason == "length":  # the toy model went on adding calls: the cut answer is content
        assert parallel and choice.finish_reason == "length" and choice.message.content == want.text
        return
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert choice.message.tool_calls and (parallel or len(choice.message.tool_calls) == 1)
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), PICK if call.function.name == "pick" else {})
    got = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in choice.message.tool_calls]
    assert got == (json.loads(want.text) if parallel else [json.loads(want.text)])


def test_streamed_tool_call(tool_client):
    chunks = list(tool_client.chat.completions.create(
        model="tiny", messages=USER, tools=TOOLS, max_tokens=30, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "now"}}))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "now"
    assert json.loads(calls[0].function.arguments) == {}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_history_is_rendered(tool_client, pair_generator):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "noon"}]
    resp = tool_client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=6,
                                               temperature=0)  # auto: the template's <tool_call> format is parsed
    rendered = 'tools: pick now\nuser: hi\n<tool_call>{"name": "now", "arguments": {}}</tool_call>\ntool: noon\nassistant: '
    want = pair_generator.generate(ids_of(pair_generator, rendered), 6, method="none")
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)
    assert resp.choices[0].message.content == want.text and not resp.choices[0].message.tool_calls


def test_tool_choice_none_ignores_the_tools(tool_client):
    kw = dict(model="tiny", messages=USER, max_tokens=6, temperature=0)
    plain = tool_client.chat.completions.create(**kw)
    ignored = tool_client.chat.completions.create(tools=TOOLS, tool_choice="none", **kw)
    assert ignored.choices[0].message.content == plain.choices[0].message.content
    assert ignored.usage.prompt_tokens == plain.usage.prompt_tokens


def test_template_without_tools_is_told_them_in_a_system_message(client, pair_generator):
    """The pair bundle has no chat template (plain): the tools come in a system message. On this toy tokenizer that
    message alone passes the bundle's 128 positions, so the 400 that says so counts the rendered prompt."""
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"additionalProperties": False}}}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=USER, tools=tools, max_tokens=4, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "now"}})
    listed = '[{"name":"now","parameters":{"type":"object","additionalProperties":false}}]'
    rendered = f"system: Tools: {listed}\nCall now: answer with its arguments as JSON.\nuser: hi\nassistant: "
    assert f"prompt has {len(pair_generator.tokenizer.encode(rendered))} tokens" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:  # auto: the plain template defines no tool-call format
        client.chat.completions.create(model="tiny", messages=USER, tools=tools, max_tokens=4)
    assert info.value.body["param"] == "tool_choice" and "no chat template" in info.value.body["message"]


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "strin"}}}}}], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools.0.type"),
    ({"messages": [{"role": "tool", "content": "noon"}]}, "messages.0.tool_call_id"),
])
def test_bad_tool_requests_are_400(tool_client, extra, param):
    body = {"model": "tiny", "messages": USER, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        tool_client.chat.completions.create(**body)
    assert info.value.body["param"] == param


def test_completions_refuse_tools(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"tools": TOOLS})
    assert info.value.body["param"] == "tools" and "chat" in info.value.body["message"]
