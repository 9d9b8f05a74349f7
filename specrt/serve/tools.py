"""Tool calls on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls` validated into a `ToolPlan`.

| tool_choice | what is decoded | answer |
|---|---|---|
| `"none"` (or no tools) | the tools are ignored (not rendered) | content |
| a named function `{"type": "function", "function": {"name": F}}` | F's arguments, under F's `parameters` schema | one call of F |
| `"required"` | `{"name": ..., "arguments": ...}` of one of the tools (the union of their schemas); with `parallel_tool_calls` (the default) a JSON array of one or more of them | the calls |
| `"auto"` (the default with tools) | free text, parsed after decoding in the format the chat template defines (tool_format.py) | content, or the calls it holds |

Forced calls run through the structured-output path (runtime/constraint.py): the schema's forced tokens (`{"name":"`,
a function name once its first letters decide it, `","arguments":{`) are drafted for free. `finish_reason` is
`"tool_calls"` whenever the answer holds calls. `auto` needs a template whose tool-call format can be parsed;
otherwise the request is a 400 naming why (use `required` or a named function there).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Optional

from specrt.core.errors import InvalidArgument
from specrt.runtime.constraint_limits import check_value_nesting
from specrt.serve.errors import bad_request

MAX_TOOLS = 128  # OpenAI's limit
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = ("none", "auto", "required")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]]  # [{"type": "function", "function": {"name", "description"?, "parameters"}}]
    choice: str  # "auto" | "required" | "named"
    parallel: bool
    forced_name: Optional[str] = None  # tool_choice naming one function
    parse_format: Optional[str] = None  # auto: the template's tool-call format (tool_format.FORMATS)

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def parameters(self, name: str) -> dict[str, Any]:
        return next(t["function"]["parameters"] for t in self.tools if t["function"]["name"] == name)

    def schema(self) -> Optional[dict[str, Any]]:
        """The JSON schema the answer is decoded under (None for auto: free text)."""
        if self.choice == "named":
            return self.parameters(self.forced_name)
        if self.choice != "required":
            return None
        defs: dict[str, Any] = {}
        calls = []
        for i, name in enumerate(self.names):
            params = _hoist_defs(self.parameters(name), f"t{i}_", defs)
            calls.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                          "properties": {"name": {"const": name}, "arguments": params}})
        call = calls[0] if len(calls) == 1 else {"anyOf": calls}
        schema = {"type": "array", "minItems": 1, "items": call} if self.parallel else dict(call)
        if defs:
            schema["$defs"] = defs
        return schema


def _hoist_defs(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters schema nested inside the call schema, with every local `$ref` (a JSON pointer from the
    parameters' own root: `#`, `#/$defs/X`, `#/definitions/X`, `#/properties/...`) rewritten so that it still
    resolves to the same place: the parameters move to `$defs/PREFIXroot` and their own `$defs` / `definitions` to
    `$defs/PREFIXX`. (Left as they were, `#...` would resolve against the call schema: `#` the call itself,
    `#/properties/name` the function's name.) Nesting is bounded before this runs (_tool)."""
    if "$ref" not in json.dumps(schema):
        return schema
    local = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: walk(v) for k, v in node.items() if k not in ("$defs", "definitions") or node is not schema}
            ref = out.get("$ref")
            if isinstance(ref, str) and ref.startswith("#") and (ref == "#" or ref.startswith("#/")):
                for head in ("#/$defs/", "#/definitions/"):
                    if ref.startswith(head):
                        out["$ref"] = "#/$defs/" + prefix + ref[len(head):]
                        break
                else:  # the parameters object itself, or a pointer into it
                    out["$ref"] = "#/$defs/" + prefix + "root" + ref[1:]
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    root = walk(schema)
    for name, sub in local.items():
        defs[prefix + name] = walk(sub)
    defs[prefix + "root"] = root
    return root


def _tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools.{i}"
    if not isinstance(tool, dict):
        raise bad_request(f"{where} must be an object {{\"type\": \"function\", \"function\": {{...}}}}", where)
    if tool.get("type") != "function":
        raise bad_request(f"{where}.type must be 'function' (the only tool type this server runs), got "
                          f"{tool.get('type')!r:.40}", f"{where}.type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"{where}.function must be an object with a 'name'", f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise bad_request(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r:.70}",
                          f"{where}.function.name")
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"{where}.function.description must be a string", f"{where}.function.description")
    params = fn.get("parameters", EMPTY_PARAMETERS)
    if params is None:
        params = EMPTY_PARAMETERS
    if not isinstance(params, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object, got "
                          f"{type(params).__name__}", f"{where}.function.parameters")
    if params.get("type", "object") != "object":
        raise bad_request(f"{where}.function.parameters must describe an object (arguments are a JSON object), "
                          f"got type {params.get('type')!r:.40}", f"{where}.function.parameters")
    try:  # before anything walks it recursively (the call schema, the tools listing): nesting bounded
        check_value_nesting(f"{where}.function.parameters", params)
    except InvalidArgument as exc:
        raise bad_request(str(exc), f"{where}.function.parameters", code="invalid_tool_schema") from None
    params = {"type": "object", **params} if params else EMPTY_PARAMETERS  # arguments are always an object
    if fn.get("strict") is not None and not isinstance(fn.get("strict"), bool):
        raise bad_request(f"{where}.function.strict must be true or false", f"{where}.function.strict")
    out = {"name": name, "parameters": params}
    if description is not None:
        out["description"] = description
    return {"type": "function", "function": out}


def _choice(raw: Any, names: list[str]) -> tuple[str, Optional[str]]:
    if raw is None:
        return "auto", None
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise bad_request(f"tool_choice must be 'none', 'auto', 'required' or {{\"type\": \"function\", "
                              f"\"function\": {{\"name\": ...}}}}, got {raw!r:.40}", "tool_choice")
        return raw, None
    fn = raw.get("function") if isinstance(raw, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(name, str):
        raise bad_request("tool_choice naming a function must be {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}}", "tool_choice")
    if name not in names:
        raise bad_request(f"tool_choice names the function {name!r:.70}, which is not among the tools "
                          f"({', '.join(names)})", "tool_choice.function.name")
    return "named", name


def parse_tools(extra: dict[str, Any], formatter: Any) -> Optional[ToolPlan]:
    """The request's tool fields (`extra`: the body's extra fields) -> a ToolPlan, or None when the tools do not
    apply (none given, or tool_choice "none"). Raises a 400 naming the field for anything invalid."""
    from specrt.serve.tool_format import parse_format_of

    tools = extra.get("tools")
    raw_choice = extra.get("tool_choice")
    parallel = extra.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request(f"parallel_tool_calls must be true or false, got {parallel!r:.40}", "parallel_tool_calls")
    if tools is None or tools == []:
        if raw_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs 'tools' (none were given)", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of {\"type\": \"function\", \"function\": {...}}", "tools")
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"at most {MAX_TOOLS} tools are supported, got {len(tools)}", "tools")
    checked = [_tool(i, t) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise bad_request(f"two tools are named {dup!r}: function names must be unique", "tools")
    choice, forced = _choice(raw_choice, names)
    if choice == "none":
        return None
    fmt = None
    if choice == "auto":
        fmt, why = parse_format_of(formatter)
        if fmt is None:
            raise bad_request(f"tool_choice 'auto' (the default with tools) needs a chat template that defines a "
                              f"tool-call format this server can parse (Hermes/Qwen <tool_call>, Llama 3.x JSON); "
                              f"{why}: send tool_choice 'required' or name a function", "tool_choice",
                              code="unsupported_parameter")
    return ToolPlan(checked, choice, True if parallel is None else parallel, forced, fmt)


def tool_constraint(plan: ToolPlan, gen: Any) -> Any:
    """The ConstraintSpec of a forced call (None for auto), its bounds checked here (a 400 naming the tool); it is
    compiled after admission on the compile threads like any response_format (specrt/serve/service.py)."""
    from specrt.core.errors import InvalidArgument
    from specrt.runtime.constraint import ConstraintSpec

    schema = plan.schema()
    if schema is None:
        return None
    where = (f"tools.{plan.names.index(plan.forced_name)}.function.parameters" if plan.choice == "named"
             else "tools")
    try:
        spec = ConstraintSpec.json_schema(schema)
    except InvalidArgument as exc:
        raise bad_request(f"cannot decode under the tool parameters schema: {exc}", where,
                          code="invalid_tool_schema") from None
    return spec


def tool_prompt(plan: ToolPlan) -> str:
    """What a template without tool support is told (one system message), so that the model knows the tools
    it is forced to call (llama.cpp's generic format does the same). Compact: it takes context."""
    listed = json.dumps([t["function"] for t in plan.tools], ensure_ascii=False, separators=(",", ":"))
    if plan.choice == "named":
        return f"Tools: {listed}\nCall {plan.forced_name}: answer with its arguments as JSON."
    many = "a JSON array of calls" if plan.parallel else "one call as JSON"
    return f'Tools: {listed}\nAnswer with {many}: {{"name": ..., "arguments": {{...}}}}.'
