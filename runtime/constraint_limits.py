"""Bounds on a schema, regex or grammar, checked in Python before llguidance (native code) sees it.

llguidance compiles a JSON schema's `$ref`s and a grammar's rules recursively on the native stack, and a deep
enough input overflows it: the process dies (SIGSEGV), whatever thread it runs in. Measured with llguidance 1.9.1
on an 8 MiB stack (docs/structured-output.md, "Limits"): an object level behind a `$ref` (`{"type": "object",
"properties": {"a": {"$ref": next}}}`) crashed at ~930 levels, an array level (`{"items": {"$ref": next}}`) at
~1000-1200 levels (2000-2400 nested containers), a Lark chain of rules (`r0: "a" r1`) at ~2600 rules. Inline
nesting stops at 128 inside llguidance (serde_json's limit) with an error, not a crash.

The bounds below stay well under that (2x on an 8 MiB stack), and the compile itself runs on threads with a
256 MiB stack (runtime/constraint_pool.py): ~64x. Sizes bound compile time (a 158 KB object of 3000 optional
properties compiles in ~1 s here, 317 KB in ~6 s: it grows faster than linearly).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator
from urllib.parse import unquote

from specrt.core.errors import InvalidArgument

MAX_BYTES = 256 * 1024  # a schema's JSON, a regex or a grammar, UTF-8
MAX_NESTING = 128  # containers nested in the text itself (llguidance refuses more)
MAX_DEPTH = 1000  # containers nested through $ref resolution (recursive groups counted by their size)
MAX_RULES = 1000  # rules and terminals defined in a grammar


class ConstraintError(InvalidArgument):
    """A schema, regex or grammar that the constraint library cannot compile (the message says why)."""


class ConstraintLimitError(ConstraintError):
    """A schema, regex or grammar past one of the bounds above (the message names the bound)."""


def check_size(kind: str, text: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise ConstraintLimitError(f"the {kind} is {size:,} bytes; the limit is {MAX_BYTES:,} bytes")


def check_text_nesting(kind: str, text: str) -> None:
    """Brackets nested in JSON text (outside strings), counted without parsing (json.loads would raise
    RecursionError on a deep enough file); vectorized: ~5 ms for 256 KB."""
    import numpy as np

    outside = re.sub(r'"(?:[^"\\]|\\.)*"', "", text).encode("utf-8", "surrogatepass")
    b = np.frombuffer(outside, dtype=np.uint8)
    steps = np.isin(b, (91, 123)).astype(np.int32) - np.isin(b, (93, 125))  # [ { open, ] } close
    if steps.size and int(np.cumsum(steps).max()) > MAX_NESTING:
        raise ConstraintLimitError(f"the {kind} nests deeper than {MAX_NESTING} levels (the limit)")


def check_value_nesting(kind: str, value: Any) -> None:
    """The same bound on a parsed value (a dict given to the Python API), walked without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_NESTING:
                raise ConstraintLimitError(f"the {kind} nests deeper than {MAX_NESTING} levels (the limit)")
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))


def _containers(root: Any) -> Iterator[tuple[Any, list[Any]]]:
    """(container, its child containers) for every dict and list in the document, parents first."""
    stack = [root]
    while stack:
        node = stack.pop()
        children = [c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, (dict, list))]
        yield node, children
        stack.extend(children)


def _resolver(root: Any, nodes: list[Any]):
    anchors, ids = {}, {}
    for node in nodes:
        if isinstance(node, dict):
            for key in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(key), str):
                    anchors[node[key]] = node
            if isinstance(node.get("$id"), str):
                ids[node["$id"].split("#")[0].rstrip("/").rsplit("/", 1)[-1]] = node

    def resolve(ref: str) -> Any:
        base, _, fragment = ref.partition("#")
        node = ids.get(base.rstrip("/").rsplit("/", 1)[-1]) if base else root
        if node is None or not fragment:
            return node
        if not fragment.startswith("/"):
            return anchors.get(fragment)
        for part in fragment[1:].split("/"):
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    return resolve


def schema_depth(schema: Any) -> int:
    """The longest chain of containers a compiler walks from the root, following `$ref`s: containers are
    nodes, edges go to child containers and to a `$ref`'s target. A cycle (a recursive schema) is counted
    once with all its containers (strongly connected components, Tarjan, without recursion): an upper bound
    of any depth-first walk's stack."""
    if not isinstance(schema, (dict, list)):
        return 0
    edges: dict[int, list[Any]] = {}
    nodes = []
    for node, children in _containers(schema):
        edges[id(node)] = children
        nodes.append(node)
    resolve = _resolver(schema, nodes)
    for node in nodes:
        ref = node.get("$ref") if isinstance(node, dict) else None
        target = resolve(ref) if isinstance(ref, str) else None
        if isinstance(target, (dict, list)):
            edges[id(node)].append(target)
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    component: dict[int, int] = {}  # node id -> its component's index in `longest`
    longest: list[int] = []  # per component (emitted sinks first): its size + the longest successor's
    on_stack: list[int] = []
    in_stack: set[int] = set()
    for start in nodes:
        if id(start) in index:
            continue
        work = [(id(start), iter(edges[id(start)]))]
        index[id(start)] = low[id(start)] = len(index)
        on_stack.append(id(start))
        in_stack.add(id(start))
        while work:
            v, it = work[-1]
            child = next(it, None)
            if child is not None:
                w = id(child)
                if w not in index:
                    index[w] = low[w] = len(index)
                    on_stack.append(w)
                    in_stack.add(w)
                    work.append((w, iter(edges[w])))
                elif w in in_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                members = []
                while True:
                    w = on_stack.pop()
                    in_stack.discard(w)
                    members.append(w)
                    if w == v:
                        break
                c = len(longest)
                for w in members:
                    component[w] = c
                below = max((longest[component[id(x)]] for w in members for x in edges[w]
                             if component.get(id(x), c) != c), default=0)
                longest.append(len(members) + below)
    return longest[component[id(schema)]]


def check_schema(kind: str, schema: Any) -> None:
    depth = schema_depth(schema)
    if depth > MAX_DEPTH:
        raise ConstraintLimitError(f"the {kind} nests {depth} objects/arrays deep through its $refs; the limit is "
                                   f"{MAX_DEPTH} (a chain of $refs that deep crashes the schema compiler)")


_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_.-]*[ \t]*(?:::=|:)", re.MULTILINE)


def check_grammar(text: str) -> None:
    """Rules counted by their definitions (Lark `name:`, GBNF `name ::=`); JSON schemas embedded with `%json`
    are checked as schemas."""
    rules = len(_RULE.findall(text))
    if rules > MAX_RULES:
        raise ConstraintLimitError(f"the grammar defines {rules} rules; the limit is {MAX_RULES}")
    decoder = json.JSONDecoder()
    for m in re.finditer(r"%json\s*", text):
        try:
            schema, _ = decoder.raw_decode(text, m.end())
        except ValueError:
            continue  # not JSON: llguidance reports the syntax error
        except RecursionError:
            raise ConstraintLimitError(f"the grammar's %json schema nests deeper than {MAX_NESTING} levels "
                                       "(the limit)") from None
        check_value_nesting("grammar's %json schema", schema)
        check_schema("grammar's %json schema", schema)


def check(kind: str, text: str) -> None:
    """Every bound for a constraint of `kind` (json_schema, json_object, regex, grammar) with `text`."""
    check_size(kind, text)
    if kind == "json_schema":
        check_text_nesting("JSON schema", text)
        if "$ref" not in text:  # no reference: the nesting bound above is the depth bound
            return
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise ConstraintLimitError(f"the JSON schema is not valid JSON: {exc}") from None
        check_schema("JSON schema", schema)
    elif kind == "grammar":
        check_grammar(text)
