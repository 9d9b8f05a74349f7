"""Tool-call formats (specrt/serve/tool_format.py, tools.py) without a server: what a template renders, parsing
Hermes / Llama 3.x answers, the forced-call schemas, and the 400s of invalid tools."""

from __future__ import annotations

import json

import jsonschema
import pytest

from specrt.runtime.chat_template import ChatFormatter
from specrt.serve.errors import APIError
from specrt.serve.tool_format import calls_from_text, parse_format_of, template_features
from specrt.serve.tools import parse_tools

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
           "system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + "
           "'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")
HERMES = ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
          "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}"
          "</tool_call>{% endfor %}\n{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}assistant: ")
LLAMA3 = ("{% if tools %}Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
          "and its value}.{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}{% for m in messages %}"
          "{{ m.content }}{% endfor %}")
MISTRAL = "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}}]


def plan(template=HERMES, **extra):
    return parse_tools({"tools": TOOLS, **extra}, ChatFormatter(template))


def test_template_features_and_formats():
    assert template_features(ChatFormatter()) == frozenset()
    assert template_features(ChatFormatter(SMOLLM2)) == frozenset()  # SmolLM2's template knows no tools
    assert template_features(ChatFormatter(HERMES)) == {"tools", "tool_calls"}
    assert parse_format_of(ChatFormatter(HERMES)) == ("hermes", "")
    assert parse_format_of(ChatFormatter(LLAMA3)) == ("llama3_json", "")
    assert "no chat template" in parse_format_of(ChatFormatter())[1]
    assert "does not render tools" in parse_format_of(ChatFormatter(SMOLLM2))[1]
    assert "does not parse" in parse_format_of(ChatFormatter(MISTRAL))[1]


def test_hermes_answers_are_parsed():
    p = plan()
    content, calls = calls_from_text(p, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": '
                                        '{"city": "Paris"}}\n</tool_call>\n<tool_call>{"name": "now", "arguments": {}}'
                                        '</tool_call>')
    assert content == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("now", {})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    # without parallel_tool_calls only the first call is kept
    assert len(calls_from_text(plan(parallel_tool_calls=False), "<tool_call>{\"name\": \"now\", \"arguments\": {}}"
                                                                 "</tool_call>" * 2)[1]) == 1
    # not JSON, or an unknown function: the answer is content
    for text in ("<tool_call>{not json</tool_call>", '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
                 "plain answer"):
        assert calls_from_text(p, text) == (text, [])


def test_llama3_answers_are_parsed():
    p = plan(LLAMA3)
    content, calls = calls_from_text(p, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "a;b"}}; '
                                        '{"name": "now", "parameters": {}}')
    assert content is None
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "a;b"}, {}]
    assert calls_from_text(p, "It is sunny.") == ("It is sunny.", [])


def test_forced_schemas_accept_calls_and_only_calls():
    required = plan(tool_choice="required").schema()
    jsonschema.validate([{"name": "get_weather", "arguments": {"city": "x"}}, {"name": "now", "arguments": {}}],
                        required)
    for bad in ([], [{"name": "rm", "arguments": {}}], [{"name": "get_weather", "arguments": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, required)
    content, calls = calls_from_text(plan(tool_choice="required"), '[{"name":"now","arguments":{}},'
                                     '{"name":"get_weather","arguments":{"city":"x"}}]')
    assert content is None and [c["function"]["name"] for c in calls] == ["now", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "x"}
    single = plan(tool_choice="required", parallel_tool_calls=False).schema()
    jsonschema.validate({"name": "now", "arguments": {}}, single)
    named = plan(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.schema() == TOOLS[0]["function"]["parameters"]
    content, calls = calls_from_text(named, '{"city": "Oslo"}')
    assert content is None and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert calls_from_text(named, '{"city": "Os') == ('{"city": "Os', [])  # cut by max_tokens: content


def test_parameter_defs_are_hoisted_so_refs_resolve():
    tool = {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"to": {"$ref": "#/$defs/Point"}}, "required": ["to"],
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}}}
    schema = parse_tools({"tools": [tool, TOOLS[1]], "tool_choice": "required"}, ChatFormatter(HERMES)).schema()
    jsonschema.validate([{"name": "move", "arguments": {"to": {"x": 1}}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "move", "arguments": {"to": {"x": "a"}}}], schema)


@pytest.mark.parametrize("extra, param, contains", [
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type", "'function'"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name", "letters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools.0.function.parameters",
     "JSON schema object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters", "object"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools", "unique"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "tool_choice.function.name",
     "not among the tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'required'"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
])
def test_invalid_tools_are_400_naming_the_field(extra, param, contains):
    with pytest.raises(APIError) as info:
        parse_tools(extra, ChatFormatter(HERMES))
    assert info.value.status == 400 and info.value.param == param and contains in info.value.message


def test_tool_choice_none_and_no_tools_ignore_them():
    assert parse_tools({"tools": TOOLS, "tool_choice": "none"}, ChatFormatter()) is None
    assert parse_tools({}, ChatFormatter()) is None
    with pytest.raises(APIError, match="does not render tools"):  # auto (the default) on SmolLM2's template
        parse_tools({"tools": TOOLS}, ChatFormatter(SMOLLM2))


def test_a_separate_tool_use_template_is_picked_for_tools(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": [{"name": "default", "template": SMOLLM2},
                                                    {"name": "tool_use", "template": HERMES}]}))
    formatter = ChatFormatter.from_tokenizer_config(config)
    assert formatter.template_source == SMOLLM2 and formatter.with_tools().template_source == HERMES
    assert parse_tools({"tools": TOOLS}, formatter.with_tools()).parse_format == "hermes"
    assert ChatFormatter(HERMES).with_tools().template_source == HERMES  # one template: itself


@pytest.mark.parametrize("parallel", [False, True])
def test_refs_from_the_parameters_root_keep_their_target_in_the_call_schema(parallel):
    # `#/properties/name` and `#` point into the parameters; left as they were they resolved against the call schema
    # (the function's name {"const": ...}, the whole call): decoding was silently constrained to something else
    params = {"type": "object", "required": ["name", "kids"], "properties": {
        "name": {"type": "integer"}, "same": {"$ref": "#/properties/name"},
        "kids": {"type": "array", "items": {"$ref": "#"}}}}
    tool = {"type": "function", "function": {"name": "tree", "parameters": params}}
    schema = parse_tools({"tools": [tool, TOOLS[1]], "tool_choice": "required", "parallel_tool_calls": parallel},
                         ChatFormatter(HERMES)).schema()
    good = {"name": "tree", "arguments": {"name": 1, "same": 2, "kids": [{"name": 3, "kids": []}]}}
    jsonschema.validate([good] if parallel else good, schema)
    for args in ({"name": 1, "same": "tree", "kids": []}, {"name": 1, "kids": [{"name": "tree", "arguments": {}}]}):
        bad = {"name": "tree", "arguments": args}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([bad] if parallel else bad, schema)


def test_parameters_nested_too_deeply_are_400_before_anything_walks_them():
    params = {"type": "integer"}
    for _ in range(700):  # under Python's recursion limit to parse, over it to copy and rewrite
        params = {"type": "object", "properties": {"a": params}}
    tool = {"type": "function", "function": {"name": "f", "parameters": {**params, "$defs": {"x": {}}}}}
    with pytest.raises(APIError) as info:
        parse_tools({"tools": [tool], "tool_choice": "required"}, ChatFormatter(HERMES))
    assert info.value.status == 400 and info.value.param == "tools.0.function.parameters"
    assert "nests deeper than 128" in info.value.message
