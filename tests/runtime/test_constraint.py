"""Constrained decoding (runtime/constraint.py, constrained.py): outputs match the constraint, speculative
greedy output equals constrained plain decoding for every proposer, forced tokens are verified for free,
sampling stays lossless with respect to the masked target, and bad constraints fail clearly."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from specrt.runtime.constraint import ConstraintError, ConstraintSpec

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "kind", "count", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "kind": {"enum": ["module", "function", "class"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 999},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}}}
PROMPT = "import os\nimport json\n"


@pytest.mark.parametrize("method", ["none", "draft", "ngram", "hybrid"])
def test_json_schema_greedy_valid_and_equal_to_constrained_plain(pair_generator, method):
    spec = ConstraintSpec.json_schema(SCHEMA)
    plain = pair_generator.generate(PROMPT, 100, method="none", constraint=spec)
    res = pair_generator.generate(PROMPT, 100, method=method, constraint=spec, num_speculative_tokens=4)
    assert res.finish_reason == "stop", res.text
    jsonschema.validate(json.loads(res.text), SCHEMA)
    assert res.token_ids == plain.token_ids
    assert res.stats.constraint.startswith("json_schema: ")
    if method != "none":  # keys, quotes and braces are forced: verified as drafts (rejected only after a rejected
        # draft, or where the target spells the forced bytes with other tokens)
        assert res.stats.forced_tokens > 0 and res.stats.forced_accepted > res.stats.forced_tokens // 2
        assert res.stats.target_calls < plain.stats.target_calls
    else:
        assert res.stats.forced_tokens == 0


def test_self_draft_with_constraint_accepts_everything(self_generator):
    spec = ConstraintSpec.json_schema(SCHEMA)
    plain = self_generator.generate(PROMPT, 100, method="none", constraint=spec)
    res = self_generator.generate(PROMPT, 100, method="draft", constraint=spec, num_speculative_tokens=4)
    assert res.token_ids == plain.token_ids
    assert res.stats.acceptance_rate == 1.0


def test_forced_tokens_off_gives_the_same_output(pair_generator):
    spec = ConstraintSpec.json_schema(SCHEMA)
    on = pair_generator.generate(PROMPT, 100, method="ngram", constraint=spec)
    off = pair_generator.generate(PROMPT, 100, method="ngram", constraint=spec, forced_tokens=False)
    assert on.token_ids == off.token_ids and off.stats.forced_tokens == 0


def test_json_object_and_regex_and_grammar(pair_generator):
    res = pair_generator.generate(PROMPT, 80, method="hybrid", constraint=ConstraintSpec.json_object())
    assert res.finish_reason == "stop" and isinstance(json.loads(res.text), dict)
    pattern = r"(yes|no), [0-9]{2,4} (cats|dogs)"
    res = pair_generator.generate(PROMPT, 40, method="draft", constraint=ConstraintSpec.regex(pattern))
    assert res.finish_reason == "stop" and re.fullmatch(pattern, res.text), res.text
    lark = 'start: "(" item ("," item)? ")"\nitem: /[a-z]{1,4}/'
    res = pair_generator.generate(PROMPT, 60, method="ngram", constraint=ConstraintSpec.grammar(lark))
    assert res.finish_reason == "stop" and re.fullmatch(r"\([a-z]{1,4}(,[a-z]{1,4})?\)", res.text), res.text
    gbnf = 'root ::= "x" [0-9] [0-9]?'
    res = pair_generator.generate(PROMPT, 10, method="none", constraint=ConstraintSpec.grammar(gbnf))
    assert re.fullmatch(r"x[0-9]{1,2}", res.text), res.text


@pytest.mark.parametrize("spec, message", [
    (lambda: ConstraintSpec.regex("(ab"), "unclosed group"),
    (lambda: ConstraintSpec.json_schema({"type": "strin"}), "strin"),
    (lambda: ConstraintSpec.json_schema("{not json"), "not valid JSON"),
    (lambda: ConstraintSpec.grammar("start: missing_rule"), "missing_rule"),
])
def test_bad_constraint_is_a_clear_error(pair_generator, spec, message):
    with pytest.raises(ConstraintError, match=message):
        pair_generator.generate(PROMPT, 5, constraint=spec())
    assert pair_generator.generate(PROMPT, 3, method="none").token_ids  # still usable


def test_a_bad_regex_is_one_line(pair_generator):
    with pytest.raises(ConstraintError) as err:  # the library draws carets under the pattern over several lines
        pair_generator.compile_constraint(ConstraintSpec.regex("[a-"))
    assert "\n" not in str(err.value) and "unclosed" in str(err.value)


SCHEMA_WITHOUT_END = {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"],
                      "additionalProperties": False}
SCHEMA_TOO_LARGE = {"type": "object", "additionalProperties": False, "required": ["f0000", "f0001"],
                    "properties": {f"f{i:04d}": {"type": "string", "maxLength": 3} for i in range(2500)}}


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_schemas_the_parser_cannot_finish_are_clear_errors_not_unfinished_output(pair_generator, method):
    # a cycle with no way out: refused at compile time where nothing can be generated ({"$ref": "#"}), else where
    # decoding reaches the dead end ({"a": ...), instead of an empty or unfinished text ending with "stop"; a schema
    # past the parser's limits (llguidance: 2000 items per row): a ConstraintError naming the limit, one line
    with pytest.raises(ConstraintError, match="admits no complete output"):
        pair_generator.compile_constraint(ConstraintSpec.json_schema({"$ref": "#"}))
    with pytest.raises(ConstraintError, match="admits no complete output"):
        pair_generator.generate(PROMPT, 30, method=method, constraint=ConstraintSpec.json_schema(SCHEMA_WITHOUT_END))
    with pytest.raises(ConstraintError, match="beyond what the constraint parser can follow") as err:
        pair_generator.generate(PROMPT, 30, method=method, constraint=ConstraintSpec.json_schema(SCHEMA_TOO_LARGE))
    assert "\n" not in str(err.value) and len(str(err.value)) < 400
    assert pair_generator.generate(PROMPT, 3, method="none").token_ids  # still usable


def test_boolean_schemas():
    assert ConstraintSpec.json_schema(True) == ConstraintSpec.json_schema({})
    with pytest.raises(ConstraintError, match="false admits no value"):
        ConstraintSpec.json_schema(False)


def test_bad_constraint_arguments(pair_generator):
    from specrt.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="ConstraintSpec"):
        pair_generator.generate(PROMPT, 5, constraint={"type": "object"})
    with pytest.raises(InvalidArgument, match="kind"):
        ConstraintSpec("xml", "x")
    with pytest.raises(InvalidArgument, match="forced_tokens"):
        pair_generator.generate(PROMPT, 5, constraint=ConstraintSpec.json_object(), forced_tokens="yes")


def _exact_constrained_joint(generator, prompt_ids, spec, params, steps):
    """{3-token tuple: probability} of constrained target-only sampling, enumerated exactly."""
    from specrt.runtime.constrained import masked_logits
    from specrt.runtime.sampling import warp

    target = generator.target
    dist: dict = {}

    def rec(prefix, prob):
        if len(prefix) == steps or (prefix and prefix[-1] in generator.eos_ids):
            dist[tuple(prefix)] = dist.get(tuple(prefix), 0.0) + prob
            return
        c = generator.compile_constraint(spec)
        c.consume(prefix)
        target.reset()
        logits = target.forward(np.asarray(list(prompt_ids) + prefix, dtype=np.int64))[-1:]
        q = warp(masked_logits(logits, c.masks([])), params)[0]
        for t in np.flatnonzero(q):
            rec(prefix + [int(t)], prob * q[t])

    rec([], 1.0)
    return dist


@pytest.mark.slow
@pytest.mark.parametrize("method, k", [("draft", 2), ("hybrid", 2), ("draft", 0)])
# 2000 samples each: on the fused graph only (masks and acceptance are the loop's, the same code on either
# graph; test_loop.py / test_hybrid.py check sampling on both graphs)
@pytest.mark.parametrize("pair_generator", ["ort"], indirect=True)
def test_constrained_sampling_is_lossless(pair_generator, method, k):
    """Speculative sampling under a constraint emits the masked target's exact joint distribution: with an
    unrelated draft most sampled drafts are refused (kept, to be rejected); at k = 0 the forced "#" is the
    only draft."""
    from specrt.runtime.sampling import SamplingParams

    spec = ConstraintSpec.regex(r"(a|b|e)#(a|b|e)")
    prompt_ids = pair_generator.tokenizer.encode(PROMPT)
    exact = _exact_constrained_joint(pair_generator, prompt_ids, spec, SamplingParams(temperature=1.5, top_k=3), 3)
    counts: dict = {}
    rng = np.random.default_rng(0)
    n, forced = 2000, 0
    for _ in range(n):
        res = pair_generator.generate(prompt_ids, 3, temperature=1.5, top_k=3, seed=int(rng.integers(1 << 30)),
                                      method=method, num_speculative_tokens=k, constraint=spec)
        counts[tuple(res.token_ids)] = counts.get(tuple(res.token_ids), 0) + 1
        forced += res.stats.forced_tokens
    assert forced > 0 or k > 0
    assert set(counts) <= set(exact)
    keys = set(exact) | set(counts)
    tv = 0.5 * sum(abs(exact.get(key, 0.0) - counts.get(key, 0) / n) for key in keys)
    assert tv < 0.08, f"total variation {tv:.3f} between constrained speculative samples and the exact distribution"
