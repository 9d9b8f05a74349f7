"""Constraint bounds (runtime/constraint_limits.py) and the compile threads (runtime/constraint_pool.py): inputs
that crash llguidance's compiler (a $ref chain ~1000 object levels deep, a Lark chain of 3000 rules) or that
Python's json cannot nest are refused with one clear error before any native code runs; compiles run on large
stacks, bounded in time, and are cached per constraint."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from specrt.runtime.constraint import ConstraintError, ConstraintSpec
from specrt.runtime.constraint_limits import MAX_DEPTH, MAX_RULES, ConstraintLimitError, schema_depth
from specrt.runtime.constraint_pool import CompilePool, CompilerBusy, CompileTimeout


def ref_chain(levels: int) -> dict:
    """An object per level, each behind a $ref: 3 containers per level (llguidance 1.9.1 crashed at ~930)."""
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(levels)}
    defs[f"d{levels}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def lark_chain(rules: int) -> str:
    return "\n".join(["start: r0"] + [f'r{i}: "a" r{i + 1}' for i in range(rules)] + [f'r{rules}: "b"'])


def test_schema_depth_follows_refs_and_counts_a_cycle_once():
    assert schema_depth(ref_chain(10)) == 3 * 10 + 3  # root, $defs, then 3 per level, the last one
    tree = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array",
                                                                          "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    assert schema_depth(tree) == 6  # root, $defs + the cycle node, properties, kids, items
    anchored = {"$defs": {"a": {"$anchor": "A", "items": {"$ref": "#B"}}, "b": {"$anchor": "B", "items": {}}},
                "$ref": "#A"}
    assert schema_depth(anchored) == 6


@pytest.mark.parametrize("make, message", [
    (lambda: ConstraintSpec.json_schema(ref_chain(1000)), "through its $refs; the limit is"),
    (lambda: ConstraintSpec.json_schema(json.dumps(ref_chain(1000))), "through its $refs"),
    (lambda: ConstraintSpec.json_schema("[" * 100_000 + "]" * 100_000), "nests deeper than 128"),
    (lambda: ConstraintSpec.json_schema(_nested(5000)), "nests deeper than 128"),  # json.dumps: RecursionError
    (lambda: ConstraintSpec.json_schema({"enum": ["x" * 300_000]}), "the limit is 262,144 bytes"),
    (lambda: ConstraintSpec.grammar(lark_chain(3000)), f"defines 3002 rules; the limit is {MAX_RULES}"),
    (lambda: ConstraintSpec.grammar('start: %json ' + json.dumps(ref_chain(1000))), "%json schema nests"),
    (lambda: ConstraintSpec.regex("a" * 300_000), "the limit is"),
])
def test_past_the_bounds_is_one_clear_error(make, message):
    with pytest.raises(ConstraintLimitError, match=r"[^\n]+") as info:
        make()
    assert message in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, ConstraintError)


def _nested(depth: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(depth):
        s = {"type": "array", "items": s}
    return s


def test_within_the_bounds_compiles_and_generates(pair_generator):
    chain = ref_chain(MAX_DEPTH // 3 - 2)  # just under the depth bound
    c = pair_generator.compile_constraint(ConstraintSpec.json_schema(chain))
    assert c.valid_prefix(pair_generator.tokenizer.encode('{"a":{"a":', add_special_tokens=False)) > 0
    grammar = lark_chain(MAX_RULES - 3)
    res = pair_generator.generate("x", 4, method="none", constraint=ConstraintSpec.grammar(grammar))
    assert res.text == "aaaa"


def test_compile_threads_have_room_where_an_ordinary_thread_crashes(tokenizer_path):
    # the same native compile that kills a process on an 8 MiB stack (1200 array levels) runs on a compile thread
    code = textwrap.dedent("""
        import json, sys, llguidance
        from specrt.runtime.constraint_pool import COMPILE_POOL
        defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(1200)}
        defs["d1200"] = {"type": "integer"}
        g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({"$defs": defs, "$ref": "#/$defs/d0"}))
        tok = llguidance.LLTokenizer(open(sys.argv[1]).read())
        if sys.argv[2] == "pool":
            m = COMPILE_POOL.run(lambda: llguidance.LLMatcher(tok, g, log_level=0))
        else:
            m = llguidance.LLMatcher(tok, g, log_level=0)
        print("compiled", m.is_error())
    """)
    tok = str(tokenizer_path)
    pool = subprocess.run([sys.executable, "-c", code, tok, "pool"], capture_output=True, text=True, timeout=300)
    assert pool.returncode == 0 and "compiled False" in pool.stdout, pool.stderr[-500:]
    plain = subprocess.run([sys.executable, "-c", code, tok, "main"], capture_output=True, text=True, timeout=300)
    assert plain.returncode == -11  # SIGSEGV: what the bounds and the compile threads exist for


def test_a_compile_past_its_time_is_refused_and_a_busy_pool_says_so():
    pool = CompilePool(threads=1, seconds=0.3, wait_seconds=0.3)
    release = threading.Event()
    t0 = time.perf_counter()
    with pytest.raises(CompileTimeout, match="took longer than 0.3 s"):
        pool.run(lambda: release.wait(5), "json_schema")
    assert time.perf_counter() - t0 < 2
    with pytest.raises(CompilerBusy, match="busy"):  # the one thread still runs the abandoned compile
        pool.run(lambda: 1)
    release.set()
    assert pool.run(lambda: 2) == 2
    with pytest.raises(ValueError, match="boom"):
        pool.run(lambda: (_ for _ in ()).throw(ValueError("boom")))


def test_a_constraint_compiles_once_then_is_copied(pair_generator):
    schema = {"type": "object", "properties": {f"cached{i}": {"type": "integer"} for i in range(40)}}
    spec = ConstraintSpec.json_schema(schema)
    a = pair_generator.compile_constraint(spec)
    b = pair_generator.compile_constraint(ConstraintSpec.json_schema(schema))
    assert a.matcher is not b.matcher
    ids = pair_generator.tokenizer.encode('{"cached1":1', add_special_tokens=False)
    a.consume(ids)  # independent states
    assert b.valid_prefix(ids) == len(ids) and a.valid_prefix(ids) < len(ids)
