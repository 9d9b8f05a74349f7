"""Chat prompts: the checkpoint's Jinja `chat_template` when the bundle has one, else a plain template.

Runtime side (the demo, `generate --chat` and `serve` all render through here; it needs jinja2, a base
dependency, and nothing of the web server).

The plain template (documented in the README, "Serving") is one line per message and an open assistant turn:

    system: You are terse.
    user: Hello
    assistant: <- generation starts here

A checkpoint template is rendered like Hugging Face transformers does (sandboxed Jinja, `trim_blocks`,
`lstrip_blocks`, `add_generation_prompt=True`, `bos_token` / `eos_token` from tokenizer_config.json).
Its text already holds any special tokens, so it is tokenized without adding them again. Rendering is
bounded in time and size (`runtime/template_bounds.py`): a hit bound is an `InvalidArgument`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Optional, Sequence

from specrt.core.errors import BundleError, InvalidArgument, SpecrtError
from specrt.core.text import lone_surrogate
from specrt.runtime.template_bounds import (RenderBounds, bounded_filter, bounded_join,
                                            check_args, check_binop, check_format, check_result, render_bounded)


def plain_template(messages: Sequence[dict[str, str]]) -> str:
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", "lstrip": false, ...}
        return str(value.get("content", ""))
    return "" if value is None else str(value)


RESERVED = frozenset({"messages", "tools", "bos_token", "eos_token"})  # set by render itself


def check_variables(variables: Optional[dict[str, Any]]) -> None:
    """Template variables a caller adds (the server's `chat_template_kwargs`) never set what render sets itself."""
    reserved = RESERVED & set(variables or ())
    if reserved:
        raise InvalidArgument(f"template variables cannot set {', '.join(sorted(reserved))} (the request's own "
                              "fields and the tokenizer's special tokens set them)")


def _pick_template(raw: Any, name: str = "default") -> Optional[str]:
    """The named template of a checkpoint that has several (`tool_use`: None when it has no such one)."""
    if isinstance(raw, str):
        return raw if name == "default" else None
    if isinstance(raw, (list, dict)):  # [{"name": "default", "template": "..."}, ...] or {"default": "...", ...}
        named = raw if isinstance(raw, dict) else {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        if name != "default":
            return named.get(name)
        return named.get("default") or next(iter(named.values()), None)
    return None


def _generation_tag() -> Any:
    """transformers' `{% generation %} ... {% endgeneration %}` (it marks the assistant's tokens for training
    masks): rendered as its body, as apply_chat_template renders it."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return GenerationTag


def _bounded_environment(bounds: RenderBounds) -> Any:
    """The sandboxed Jinja environment of transformers' `apply_chat_template`, with size checks."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%", "+"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            check_binop(bounds, operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            check_args(bounds, list(args) + list(kwargs.values()))
            method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            if getattr(method, "__name__", None) in ("format", "format_map") and isinstance(
                    getattr(method, "__self__", None), str):
                check_format(bounds, method.__self__, args)
            return check_result(bounds, super().call(__context, __obj, *args, **kwargs))

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):  # transformers' filter
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    env.filters["tojson"] = tojson
    env.filters = {name: bounded_filter(bounds, fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ChatFormatter:
    """Messages -> (prompt text, whether the tokenizer should add its special tokens)."""

    def __init__(self, template: Optional[str] = None, bos_token: str = "", eos_token: str = "",
                 bounds: RenderBounds = RenderBounds()) -> None:
        self.template_source = template
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bounds = bounds
        self.tool_template: Optional[str] = None  # a checkpoint's separate `tool_use` template, if any
        self._compiled = None
        if template is not None:
            from jinja2.exceptions import TemplateError

            env = _bounded_environment(bounds)
            try:
                self._compiled = env.from_string(template)
            except TemplateError as exc:
                raise BundleError(f"the bundle's chat_template does not compile: {exc}") from None
            names = self._compiled.root_render_func.__globals__  # the compiled template's `~` operator
            for join in ("str_join", "markup_join"):
                if join in names:
                    names[join] = bounded_join(bounds, names[join])

    @property
    def kind(self) -> str:
        return "checkpoint" if self._compiled is not None else "plain"

    @classmethod
    def from_tokenizer_config(cls, path) -> "ChatFormatter":
        """`path`: the bundle's tokenizer_config.json, or None (plain template)."""
        if path is None or not path.is_file():
            return cls()
        try:
            cfg = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise BundleError(f"cannot read {path}: {exc}") from None
        template = _pick_template(cfg.get("chat_template"))
        if template is None:
            return cls()
        return cls._with_tool_template(cls(template, _token_text(cfg.get("bos_token")), _token_text(cfg.get(
            "eos_token"))), cfg)

    @staticmethod
    def _with_tool_template(formatter: "ChatFormatter", cfg: dict) -> "ChatFormatter":
        formatter.tool_template = _pick_template(cfg.get("chat_template"), "tool_use")
        return formatter

    def with_tools(self) -> "ChatFormatter":
        """The formatter of a request with tools: the checkpoint's `tool_use` template when it has one (what
        transformers' `apply_chat_template(..., tools=...)` picks), else this one."""
        if self.tool_template is None:
            return self
        if getattr(self, "_tools_formatter", None) is None:
            self._tools_formatter = ChatFormatter(self.tool_template, self.bos_token, self.eos_token, self.bounds)
        return self._tools_formatter

    @classmethod
    def from_manifest(cls, manifest) -> "ChatFormatter":
        """The bundle's template: `tokenizer.chat_template` names tokenizer_config.json or chat_template.jinja
        (bundles written before that key existed: tokenizer_config.json, as before); none: plain template."""
        tok = manifest.tokenizer
        cfg_rel = tok.config
        where = tok.chat_template_source
        try:
            cfg = json.loads(manifest.path(cfg_rel).read_text()) if cfg_rel else {}
            if not isinstance(cfg, dict):
                raise ValueError(f"{cfg_rel} holds a JSON {type(cfg).__name__}, not an object")
            if where is None:
                return cls()
            template = (manifest.path(where).read_text() if where.endswith(".jinja")
                        else _pick_template(cfg.get("chat_template")))
        except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
            raise BundleError(f"cannot read the bundle's chat template ({where}): {exc}") from None
        if template is None and not cfg.get("chat_template"):  # none (bundles from before `chat_template`)
            return cls()
        if not isinstance(template, str):  # the file names a template it does not hold (`chat_template: 5`)
            raise BundleError(f"the bundle's chat template file {where} holds no template (chat_template is "
                              f"{str(cfg.get('chat_template'))[:60]}); recompile the bundle")
        formatter = cls(template, _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token")))
        return cls._with_tool_template(formatter, cfg) if not where.endswith(".jinja") else formatter

    def render(self, messages: Sequence[dict[str, Any]], tools: Optional[list[dict[str, Any]]] = None,
               variables: Optional[dict[str, Any]] = None) -> tuple[str, bool]:
        """`tools` (OpenAI tool definitions) reach the template as its `tools` variable, as in transformers'
        `apply_chat_template(..., tools=...)`; `variables` are further template variables, as transformers'
        extra keyword arguments (e.g. Qwen3's `enable_thinking`; never messages, tools or the special tokens:
        `check_variables`). The plain template ignores both."""
        check_variables(variables)
        if not messages:
            raise InvalidArgument("messages must hold at least one message")
        for i, m in enumerate(messages):
            content = m.get("content") if isinstance(m, dict) else None
            where = lone_surrogate(content) if isinstance(content, str) else None
            if where is not None:
                raise InvalidArgument(f"message {i}'s content holds a lone surrogate ({where}): not valid Unicode text")
        if self._compiled is None:
            return plain_template(messages), True
        from jinja2.exceptions import TemplateError

        try:
            text = render_bounded(self.bounds, self._compiled.generate(
                **{"add_generation_prompt": True, **(variables or {})}, messages=list(messages),
                bos_token=self.bos_token, eos_token=self.eos_token, **({"tools": list(tools)} if tools else {})))
        except SpecrtError:  # a bound (TemplateBoundExceeded): already one line
            raise
        except (TemplateError, OverflowError, MemoryError, RecursionError) as exc:
            raise InvalidArgument(f"the model's chat template rejected the messages: {exc}") from None
        except (TypeError, ValueError, ArithmeticError, LookupError) as exc:  # `{{ messages + 1 }}`, `{{ 1 / 0 }}`
            raise InvalidArgument(f"the model's chat template failed on the messages: {type(exc).__name__}: "
                                  f"{exc}") from None
        where = lone_surrogate(text)
        if where is not None:  # no tokenizer takes it (a TypeError deep in `tokenizers`)
            raise InvalidArgument(f"the model's chat template rendered a lone surrogate ({where}), which is not valid "
                                  "Unicode text: fix the chat_template in the bundle's tokenizer_config.json") from None
        return text, False


def chat_prompt_ids(gen: Any, message: str, system: Optional[str] = None,
                    formatter: Optional[ChatFormatter] = None,
                    variables: Optional[dict[str, Any]] = None) -> list[int]:
    """One user message (and an optional system message) -> prompt token ids for `gen.generate`; `variables`:
    further template variables (`ChatFormatter.render`)."""
    if not message:
        raise InvalidArgument("--chat message must not be empty")
    formatter = formatter or ChatFormatter.from_manifest(gen.manifest)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
    text, add_special = formatter.render(messages, variables=variables)
    return gen.tokenizer.encode(text, add_special_tokens=add_special)
