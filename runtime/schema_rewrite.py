"""A JSON schema rewritten, before llguidance compiles it, where llguidance would refuse something that a grammar
can honour exactly or by a narrower schema (every output of the rewritten schema is valid against the original):

- `uniqueItems: false` is removed: it asks for nothing (llguidance refuses the keyword whatever its value;
  `uniqueItems: true` is still refused: a grammar cannot enforce it).
- `format` is an annotation in JSON Schema 2020-12 (validators ignore formats they do not know): a format that is
  neither one llguidance implements nor a standard JSON Schema one (OpenAPI's `int32`, `double`, `password`,
  `binary`, an application's `phone`) is removed. A standard format llguidance lacks is replaced by one it has
  whose strings are all valid for it (`uri-reference`, `iri`, `iri-reference` -> `uri`; `idn-email` -> `email`;
  `idn-hostname` -> `hostname`); the rest (`regex`, `json-pointer`, `relative-json-pointer`, `uri-template`) stay,
  and llguidance refuses them by name.
- A numeric bound beyond +-1e18 (Java's Double.MAX_VALUE, `maximum: 1e20`) is tightened to +-1e18 where the other
  bound allows it: llguidance cannot build its number pattern past ~1e18 and refuses the schema.

Schema text nests at most 128 levels (constraint_limits, checked first), so the recursive walk is safe here.
"""

from __future__ import annotations

import json
from typing import Any

KNOWN_FORMATS = frozenset({"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
                           "uuid"})  # what llguidance 1.9.1 implements
NARROWER_FORMAT = {"uri-reference": "uri", "iri": "uri", "iri-reference": "uri", "idn-email": "email",
                   "idn-hostname": "hostname"}
REFUSED_FORMATS = frozenset({"regex", "json-pointer", "relative-json-pointer", "uri-template"})
BOUND = 1e18  # llguidance builds number ranges up to here ("Failed to generate regex for float range" past it)

_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_DATA = ("enum", "const", "default", "examples")  # JSON values, not schemas


def rewrite_text(text: str) -> str:
    """The schema text for llguidance: `text` unchanged when nothing applies."""
    schema = json.loads(text)
    return json.dumps(schema) if rewrite(schema) else text


def rewrite(schema: Any) -> bool:
    """Rewrite `schema` and every object in it that can be a subschema, in place; True when something changed.
    Any keyword's object is walked (a `$ref` may point anywhere: `#/components/schemas/Pet`), except the values
    of `enum`, `const`, `default` and `examples`, and the names of a `properties`-like map."""
    if isinstance(schema, list):
        return any([rewrite(item) for item in schema])
    if not isinstance(schema, dict):
        return False
    changed = _rewrite_node(schema)
    for key, value in schema.items():
        if key in _MAP and isinstance(value, dict):
            changed |= any([rewrite(sub) for sub in value.values()])
        elif key not in _DATA:
            changed |= rewrite(value)
    return changed


def _rewrite_node(node: dict) -> bool:
    changed = False
    if node.get("uniqueItems") is False:
        del node["uniqueItems"]
        changed = True
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in KNOWN_FORMATS and fmt not in REFUSED_FORMATS:
        if fmt in NARROWER_FORMAT:
            node["format"] = NARROWER_FORMAT[fmt]
        else:
            del node["format"]
        changed = True
    changed |= _tighten(node, ("maximum", "exclusiveMaximum"), ("minimum", "exclusiveMinimum"), 1)
    return _tighten(node, ("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum"), -1) or changed


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _tighten(node: dict, keys: tuple[str, str], others: tuple[str, str], sign: int) -> bool:
    """A bound past sign * BOUND (`keys`: maximum / exclusiveMaximum for sign 1) set to sign * BOUND, unless the
    opposite bound (`others`) is itself past it (then no narrower range exists: llguidance's error stands)."""
    if any(_number(node.get(k)) and node[k] * sign >= BOUND for k in others):
        return False
    changed = False
    for key in keys:
        if _number(node.get(key)) and node[key] * sign > BOUND:
            node[key] = sign * BOUND if isinstance(node[key], float) else sign * int(BOUND)
            changed = True
    return changed
