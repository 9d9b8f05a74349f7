"""Tool calls and chat templates: what a template renders, messages with tool calls, and parsing answers.

* `template_features(formatter)`: which of the Jinja variables `tools` / `tool_calls` a checkpoint template reads
  (the plain template reads neither).
* `parse_format_of(formatter)`: the tool-call format `tool_choice: "auto"` parses, from the template's text:
  `hermes` (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`: Hermes, Qwen 2.5 / 3) or `llama3_json`
  (`{"name": ..., "parameters": ...}` JSON objects, optionally after `<|python_tag|>`, `;`-separated: Llama 3.x).
* `chat_messages(body_messages, plan, features)`: the messages the template renders. Assistant `tool_calls`
  carry their arguments parsed to objects (what Hugging Face templates expect); a template that does not read
  `tool_calls` gets them in the message's text instead, one `{"name", "arguments"}` JSON per line, and a template
  that does not read `tools` gets the tools in a system message when a call is forced (tools.tool_prompt).
* `calls_from_text(plan, text)`: the decoded answer -> (content, [tool call]).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Optional

FORMATS = ("hermes", "llama3_json")
HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"


def template_features(formatter: Any) -> frozenset[str]:
    """The tool variables ("tools", "tool_calls") the formatter's template reads."""
    source = getattr(formatter, "template_source", None)
    if not source:
        return frozenset()
    try:
        from jinja2 import Environment, meta, nodes

        ast = Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
        used = set(meta.find_undeclared_variables(ast))
        used |= {n.attr for n in ast.find_all(nodes.Getattr)} | {
            n.arg.value for n in ast.find_all(nodes.Getitem) if isinstance(n.arg, nodes.Const)}
    except Exception:  # noqa: BLE001 - a template jinja cannot parse: fall back to its text
        used = {w for w in ("tools", "tool_calls") if w in source}
    return frozenset(used & {"tools", "tool_calls"})


def parse_format_of(formatter: Any) -> tuple[Optional[str], str]:
    """(format, "") when `tool_choice: auto` can be parsed for this template, else (None, why not)."""
    source = getattr(formatter, "template_source", None)
    if not source:
        return None, "this model has no chat template (the plain template defines no tool calls)"
    if "tools" not in template_features(formatter):
        return None, "this model's chat template does not render tools"
    if "<tool_call>" in source:
        return "hermes", ""
    if PYTHON_TAG in source or '"parameters"' in source:
        return "llama3_json", ""
    return None, "this model's chat template renders tools in a format this server does not parse"


def _arguments_object(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _calls_text(calls: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                ensure_ascii=False) for c in calls)


def _assistant_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    from specrt.serve.errors import bad_request

    where = f"messages.{i}.tool_calls"
    if not isinstance(calls, list) or not calls:
        raise bad_request(f"{where} must be a non-empty list of calls", where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                fn.get("arguments", ""), str):
            raise bad_request(f"{where}.{j} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                              "\"arguments\": a JSON string}}}}", f"{where}.{j}")
        out.append({"id": str(call.get("id") or ""), "type": "function",
                    "function": {"name": fn["name"], "arguments": _arguments_object(fn.get("arguments") or "{}")}})
    return out


def chat_messages(messages: list[Any], plan: Any, features: frozenset[str]) -> list[dict[str, Any]]:
    """Parsed chat messages (schemas.ChatMessage) -> the dicts the template renders (roles checked by the caller)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.role == "tool" and m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None and m.role == "tool":
            msg["name"] = m.name
        if m.role == "assistant" and m.tool_calls is not None:
            calls = _assistant_calls(i, m.tool_calls)
            if "tool_calls" in features:
                msg["tool_calls"] = calls
            else:
                msg["content"] = "\n".join(p for p in (msg["content"], _calls_text(calls)) if p)
        out.append(msg)
    if plan is not None and plan.choice != "auto" and "tools" not in features:
        from specrt.serve.tools import tool_prompt

        text = tool_prompt(plan)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def new_call(name: str, arguments: Any) -> dict[str, Any]:
    """One OpenAI tool call; `arguments` becomes a JSON string (as OpenAI returns it)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": {"name": name, "arguments": args}}


def _call_of(obj: Any, names: list[str], key: str = "arguments") -> Optional[dict[str, Any]]:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get(key, obj.get("arguments", obj.get("parameters", {})))
    return new_call(obj["name"], args if args is not None else {})


def _hermes(text: str, names: list[str]) -> tuple[Optional[str], list[dict[str, Any]]]:
    first = text.find("<tool_call>")
    if first < 0:
        return text, []
    calls = []
    for block in HERMES.findall(text[first:]):
        try:
            call = _call_of(json.loads(block), names)
        except ValueError:
            return text, []
        if call is None:
            return text, []
        calls.append(call)
    return text[:first].strip() or None, calls


def _llama3(text: str, names: list[str]) -> tuple[Optional[str], list[dict[str, Any]]]:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].lstrip()
    if not body.startswith("{"):
        return text, []
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            obj, at = decoder.raw_decode(body, at)
        except ValueError:
            return text, []
        call = _call_of(obj, names, "parameters")
        if call is None:
            return text, []
        calls.append(call)
        while at < len(body) and body[at] in "; \n\t":
            at += 1
    return None, calls


def calls_from_text(plan: Any, text: str) -> tuple[Optional[str], list[dict[str, Any]]]:
    """The decoded answer -> (content or None, tool calls). A forced answer that is not complete JSON (cut by
    max_tokens) comes back as content with no calls; without `parallel_tool_calls` only the first call is kept."""
    names = plan.names
    if plan.choice == "named":
        try:
            obj = json.loads(text)
        except ValueError:
            return text, []
        return (None, [new_call(plan.forced_name, text)]) if isinstance(obj, dict) else (text, [])
    if plan.choice == "required":
        try:
            obj = json.loads(text)
        except ValueError:
            return text, []
        calls = [_call_of(o, names) for o in (obj if isinstance(obj, list) else [obj])]
        return (None, calls) if calls and all(calls) else (text, [])
    content, calls = (_hermes if plan.parse_format == "hermes" else _llama3)(text, names)
    return content, calls if plan.parallel else calls[:1]
