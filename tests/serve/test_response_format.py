"""`response_format` through the official OpenAI client: json_object and json_schema (strict) constrain the
output (same tokens as Generator.generate with the constraint), the constraint is in the stats, and a schema
the library cannot compile is a 400 naming response_format."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from serve_helpers import K

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["tool", "retries"],
          "properties": {"tool": {"enum": ["grep", "sed", "awk"]}, "retries": {"type": "integer", "maximum": 9}}}
MESSAGES = [{"role": "user", "content": "Pick a tool."}]


def test_json_schema_strict(client, pair_generator):
    from specrt.runtime.constraint import ConstraintSpec

    resp = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA, "strict": True}},
        extra_body={"speculative": {"method": "draft", "num_speculative_tokens": K}})
    text = resp.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
    stats = resp.model_extra["speculative_stats"]
    assert stats["constraint"].startswith("json_schema: ") and stats["forced_tokens"] > 0
    prompt = resp.usage.prompt_tokens
    assert prompt > 0
    # the same tokens as the Python API with the same constraint, plain decoding
    from specrt.runtime.chat_template import ChatFormatter

    rendered, add_special = ChatFormatter.from_manifest(pair_generator.manifest).render(MESSAGES)
    ids = pair_generator.tokenizer.encode(rendered, add_special_tokens=add_special)
    ref = pair_generator.generate(ids, 40, method="none", constraint=ConstraintSpec.json_schema(SCHEMA))
    assert ref.text == text


def test_json_object_streamed(client):
    stream = client.completions.create(model="tiny", prompt="data = ", max_tokens=60, temperature=0, stream=True,
                                       extra_body={"response_format": {"type": "json_object"}})
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("fmt, message", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, "strin"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a"}}}, "regex"),
    ({"type": "json_schema"}, "needs a 'json_schema'"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
     "uniqueItems"),  # a keyword a grammar cannot enforce: refused by name, not ignored
])
def test_uncompilable_schema_is_400(client, fmt, message):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, response_format=fmt)
    err = info.value.body
    assert err["param"] == "response_format" or err["param"].startswith("response_format")
    assert message in err["message"]


def test_a_schema_past_the_parsers_limits_is_400_not_500(client):
    # found while decoding (llguidance: at most 2000 items per row): 400 invalid_response_format, one short line;
    # a schema with nothing to generate ({"$ref": "#"}) before anything runs
    big = {"type": "object", "additionalProperties": False, "required": ["f0000", "f0001"],
           "properties": {f"f{i:04d}": {"type": "string", "maxLength": 3} for i in range(2500)}}
    for schema in (big, {"$ref": "#"}):
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=30, response_format=fmt,
                                           temperature=0,  # greedy: the parser's row limit is reached every time
                                           extra_body={"speculative": {"method": "none"}})
        err = info.value.body
        assert err["code"] == "invalid_response_format" and err["param"] == "response_format"
        assert len(err["message"]) < 400 and "\n" not in err["message"]
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices  # still serving


def test_openapi_schema_is_decoded(client):
    # OpenAPI formats are annotations (llguidance refused `password`), uniqueItems false asks for nothing
    schema = {"type": "object", "additionalProperties": False, "required": ["n", "pw"],
              "properties": {"n": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 9},
                             "pw": {"type": "array", "uniqueItems": False, "maxItems": 2,
                                    "items": {"type": "string", "format": "password", "maxLength": 3}}}}
    resp = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), schema)


def test_unknown_format_type_is_400(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5,
                                       response_format={"type": "xml"})
