"""Constrained decoding: a JSON schema, any JSON object, a regex or a grammar, through llguidance.

    spec = ConstraintSpec.json_schema({"type": "object", ...})   # or .json_object(), .regex(r"..."), .grammar(text)
    gen.generate(prompt, constraint=spec)                          # Generator compiles it on the bundle's tokenizer

llguidance was chosen by measurement (docs/structured-output.md): no runtime dependency (xgrammar pulls torch,
transformers and triton), schemas compile in ~1 ms (outlines-core: seconds per schema on a 49k vocabulary), and
it computes one token mask in tens of microseconds with the GIL released, so the mask is computed in a thread
while ONNX Runtime runs the target (runtime/constrained.py).

`Constraint` is one request's parser state: it checks drafted tokens, finds forced tokens (the only
continuation the grammar allows), computes masks [rows, V] for a verify pass and rolls back rejected tokens.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.runtime import constraint_limits
from specrt.runtime.constraint_limits import ConstraintError  # noqa: F401 - its public home is this module
from specrt.core.text import flat_line  # llguidance's parser errors dump the grammar; regex errors draw carets
from specrt.runtime.constraint_pool import COMPILE_POOL, COMPILED, TOKENIZERS
from specrt.runtime.schema_rewrite import rewrite_text

KINDS = ("json_schema", "json_object", "regex", "grammar")
# compact JSON: no free whitespace between tokens (a model could otherwise emit spaces forever), and more
# bytes are forced (drafted for free)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


@dataclasses.dataclass(frozen=True)
class ConstraintSpec:
    """What the output must match. kind: json_schema (text = the schema as JSON), json_object (any JSON
    object), regex (text = the pattern; the whole output must match it), grammar (Lark / llguidance EBNF, or
    GBNF as llama.cpp writes it)."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgument(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str):
            raise InvalidArgument(f"constraint text must be a str, got {type(self.text).__name__}")
        if self.kind != "json_object" and not self.text.strip():
            raise InvalidArgument(f"an empty {self.kind} constraint")
        constraint_limits.check(self.kind, self.text)  # before any native code sees it (a deep one crashes it)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> "ConstraintSpec":
        if isinstance(schema, str):
            constraint_limits.check_size("JSON schema", schema)
            constraint_limits.check_text_nesting("JSON schema", schema)  # json.loads would raise RecursionError
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ConstraintError(f"the JSON schema is not valid JSON: {exc}") from None
        else:
            constraint_limits.check_value_nesting("JSON schema", schema)  # json.dumps would raise RecursionError
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
        if schema is False:
            raise ConstraintError("the JSON schema false admits no value")
        return cls("json_schema", json.dumps({} if schema is True else schema))  # true: any JSON value, as {}

    @classmethod
    def json_object(cls) -> "ConstraintSpec":
        return cls("json_object", "")

    @classmethod
    def regex(cls, pattern: str) -> "ConstraintSpec":
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, text: str) -> "ConstraintSpec":
        return cls("grammar", text)

    def describe(self) -> str:
        """One short line for stats and logs."""
        if self.kind == "json_object":
            return "json_object"
        short = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"{self.kind}: {short}"


def grammar_text(spec: ConstraintSpec) -> str:
    """The llguidance grammar for `spec` (not yet checked: LLMatcher does that)."""
    import llguidance

    try:
        if spec.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(rewrite_text(spec.text), defaults=JSON_OPTIONS)
        if spec.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.text)
        return llguidance.grammar_from("grammar", spec.text)  # Lark as is; GBNF converted to Lark
    except ValueError as exc:
        raise ConstraintError(f"cannot compile the {spec.kind}: {_reworded(flat_line(exc))}") from None


def _reworded(message: str) -> str:
    """llguidance's message, where it names an option of its own that a user cannot set, said in schema terms."""
    if "coerce_one_of" in message:
        return ("oneOf is supported only where its alternatives cannot match the same value (e.g. objects told "
                "apart by a const or enum property); these can overlap: use anyOf, or make them exclusive")
    return message


class ConstraintCompiler:
    """The bundle's tokenizer as llguidance sees it (built once per tokenizer in a process, ~1 s) and a compile
    step: on the compile threads, bounded in time, cached per constraint (runtime/constraint_pool.py)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int]) -> None:
        import hashlib

        import llguidance

        self.vocab_size = vocab_size  # the target's logits width (may exceed the tokenizer's)
        self.key = (hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(), vocab_size, tuple(eos_ids))
        self.tokenizer = TOKENIZERS.get(self.key)
        if self.tokenizer is None:
            self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_ids)
            TOKENIZERS.put(self.key, self.tokenizer)

    def compile(self, spec: ConstraintSpec) -> "Constraint":
        """A fresh parser state for `spec`: a copy of the cached compiled one, else compiled now on a compile
        thread (ConstraintError when it cannot be; CompileTimeout / CompilerBusy past the pool's limits)."""
        matcher = COMPILED.get((self.key, spec))
        if matcher is None:
            matcher = COMPILE_POOL.run(lambda: self._matcher(spec), spec.kind)
            COMPILED.put((self.key, spec), matcher)
        return Constraint(matcher.deep_copy(), self.vocab_size, spec)

    def _matcher(self, spec: ConstraintSpec) -> Any:
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"cannot compile the {spec.kind}: {_reworded(flat_line(matcher.get_error()))}")
        Constraint(matcher, self.vocab_size, spec).masks([])  # the first mask (it consumes nothing, and builds
        return matcher  # the lexer, which may take long): e.g. {"$ref": "#"} has none


class Constraint:
    """One request's parser state over the committed tokens (+ tokens being verified)."""

    def __init__(self, matcher: Any, vocab_size: int, spec: ConstraintSpec) -> None:
        self.matcher = matcher
        self.spec = spec
        self.vocab_size = vocab_size
        self._words = (vocab_size + 31) // 32
        self._bits = np.zeros((1, self._words), dtype=np.int32)

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of `token_ids` (from the current state) the constraint allows in a row."""
        return self.matcher.validate_tokens(token_ids) if token_ids else 0

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the constraint forces next (its only continuation), as the tokenizer would
        produce them; [] when there is a choice."""
        if limit <= 0 or self.matcher.is_stopped():
            return []
        return self.matcher.compute_ff_tokens()[:limit]

    def _failed(self, token: int) -> ConstraintError:
        """A token the masks allowed that the parser then refused, or a mask it could not compute: the parser
        hit one of its limits (a schema too large or too recursive to follow), which only shows while decoding;
        or the state has no continuation at all (llguidance: NoExtensionBias)."""
        if "NoExtensionBias" in (self.matcher.get_error() or ""):
            return self._dead_end()
        return ConstraintError(f"the {self.spec.kind} is beyond what the constraint parser can follow here "
                               f"(at token {token}): {flat_line(self.matcher.get_error(), 200)}")

    def _dead_end(self) -> ConstraintError:
        return ConstraintError(f"the {self.spec.kind} admits no complete output from here (a reference cycle with "
                               "no way out?)")

    def consume(self, token_ids: list[int]) -> None:
        for t in token_ids:
            if self.matcher.is_stopped() and not self.matcher.is_accepting():  # a committed prefix with no way
                raise self._dead_end()  # to complete it: the end would be an unfinished output, not a "stop"
            if not self.matcher.consume_token(t):
                raise self._failed(t)

    def rollback(self, n: int) -> None:
        if n > 0 and not self.matcher.rollback(n):
            raise RuntimeError(f"cannot roll the constraint back by {n} tokens: {self.matcher.get_error()}")

    def masks(self, token_ids: list[int]) -> np.ndarray:
        """allowed [len(token_ids) + 1, V] bool: row i is the mask after token_ids[:i]. Leaves the state
        after all of token_ids (the caller rolls back what verification rejects). Runs in the mask thread:
        llguidance releases the GIL while it computes a mask."""
        rows = len(token_ids) + 1
        if self._bits.shape[0] < rows:
            self._bits = np.zeros((rows, self._words), dtype=np.int32)
        bits = self._bits
        m = self.matcher
        for i in range(rows):
            if i == 0 and m.is_stopped() and not m.is_accepting():  # the committed state is a dead end (rows
                raise self._dead_end()  # after drafts may be: `consume` refuses them if verification keeps them)
            m.unsafe_compute_mask_ptr(bits[i].ctypes.data, bits[i].nbytes)
            if m.is_error():
                raise self._failed(token_ids[i - 1] if i else -1)
            if i < rows - 1 and not m.consume_token(token_ids[i]):
                raise self._failed(token_ids[i])
        allowed = np.unpackbits(bits[:rows].view(np.uint8), axis=1, bitorder="little")[:, :self.vocab_size]
        return allowed.view(bool)
