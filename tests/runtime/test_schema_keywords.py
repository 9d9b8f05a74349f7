"""JSON schemas as applications write them (OpenAPI formats, Java's number bounds, `uniqueItems: false`, overlapping
oneOf): each either constrains the output to documents the schema accepts, or is refused before anything runs with
one line naming what is unsupported (runtime/schema_rewrite.py, docs/structured-output.md)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from specrt.runtime.constraint import ConstraintError, ConstraintSpec
from specrt.runtime.schema_rewrite import rewrite

PROMPT = "import os\nimport json\n"
DOUBLE_MAX = 1.7976931348623157e308

ACCEPTED = {
    # OpenAPI's formats (annotations for JSON Schema): llguidance refused `password` ("Unknown format")
    "openapi formats": {"type": "object", "additionalProperties": False, "required": ["id", "ratio", "pw", "blob"],
                        "properties": {"id": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 99},
                                       "ratio": {"type": "number", "format": "double", "minimum": 0, "maximum": 1},
                                       "pw": {"type": "string", "format": "password", "maxLength": 4},
                                       "blob": {"type": "string", "format": "binary", "maxLength": 4}}},
    "application format": {"type": "string", "format": "phone", "maxLength": 6},
    "ref into components": {"$ref": "#/components/schemas/Pin", "components": {"schemas": {"Pin": {
        "type": "object", "additionalProperties": False, "required": ["pin"],
        "properties": {"pin": {"type": "string", "format": "password", "maxLength": 4}}}}}},
    # standard formats llguidance lacks, decoded as a narrower one it has (a uri is a uri-reference)
    "wider formats": {"type": "array", "maxItems": 2,
                      "items": {"type": "string", "format": "uri-reference", "maxLength": 12}},
    # a no-op that llguidance refused whatever its value
    "uniqueItems false": {"type": "array", "uniqueItems": False, "maxItems": 3,
                          "items": {"type": "integer", "minimum": 0, "maximum": 9}},
    # bounds past +-1e18: llguidance could not build the number pattern ("Failed to generate regex")
    "java double bounds": {"type": "object", "additionalProperties": False, "required": ["x", "n"],
                           "properties": {"x": {"type": "number", "minimum": -DOUBLE_MAX, "maximum": DOUBLE_MAX},
                                          "n": {"type": "integer", "format": "int64",
                                                "minimum": -2 ** 63, "maximum": 2 ** 63 - 1}}},
}


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_schema_is_decoded_to_valid_documents(pair_generator, name):
    schema = ACCEPTED[name]
    spec = ConstraintSpec.json_schema(schema)
    finished = 0
    for seed in range(6):  # sampled: many paths through the schema, not only the greedy one
        res = pair_generator.generate(PROMPT, 60, method=("none", "draft")[seed % 2], constraint=spec,
                                      temperature=1.0, seed=seed)
        if res.finish_reason == "stop":
            jsonschema.validate(json.loads(res.text), schema)
            finished += 1
    assert finished >= 3


def test_rewrite_keeps_what_llguidance_enforces():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "format": "date-time"}, "b": {"type": "string", "format": "idn-email"},
        "c": {"type": "string", "format": "regex"}, "d": {"type": "array", "uniqueItems": True},
        "e": {"type": "number", "minimum": 1e20}, "f": {"type": "number", "maximum": 5, "minimum": -1e30}}}
    assert rewrite(schema)
    props = schema["properties"]
    assert props["a"]["format"] == "date-time" and props["b"]["format"] == "email"
    assert props["c"]["format"] == "regex" and props["d"]["uniqueItems"] is True  # refused by llguidance, by name
    assert props["e"] == {"type": "number", "minimum": 1e20}  # no narrower range: llguidance's error stands
    assert props["f"] == {"type": "number", "maximum": 5, "minimum": -1e18}


@pytest.mark.parametrize("schema, message", [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "format": "json-pointer"}, "json-pointer"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf is supported only where its alternatives cannot"),
])
def test_unenforceable_schema_is_refused_naming_it(pair_generator, schema, message):
    with pytest.raises(ConstraintError, match=message) as info:
        pair_generator.generate(PROMPT, 5, constraint=ConstraintSpec.json_schema(schema))
    assert "\n" not in str(info.value) and "coerce_one_of" not in str(info.value)


def test_rewrite_reaches_subschemas_anywhere_a_ref_can_point_but_not_data():
    schema = {"$ref": "#/components/schemas/Pet",
              "components": {"schemas": {"Pet": {"type": "object", "properties": {
                  "name": {"type": "string", "format": "password"},
                  "uniqueItems": False,  # a property named uniqueItems that must be absent: kept
                  "tags": {"type": "array", "uniqueItems": False, "default": [{"format": "phone"}]}}}}}}
    assert rewrite(schema)
    pet = schema["components"]["schemas"]["Pet"]["properties"]
    assert pet["name"] == {"type": "string"} and pet["uniqueItems"] is False
    assert pet["tags"] == {"type": "array", "default": [{"format": "phone"}]}
