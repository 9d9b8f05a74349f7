"""The JSON extraction suite (`specrt bench --suite json`): every case's example validates against its schema
and is accepted token by token by its constraint; the bench runs the configurations, checks validity and
equality with constrained plain decoding, and writes its Markdown section."""

import json

import jsonschema

from helpers import run_cli
from specrt.bench.json_cases import CASES
from specrt.bench.json_bench import json_markdown, run_json_bench
from specrt.runtime.constraint import ConstraintSpec


def test_cases_are_valid_and_accepted_by_their_constraint(pair_generator):
    assert len(CASES) >= 20 and len({c.name for c in CASES}) == len(CASES)
    assert sum(c.origin != "specrt" for c in CASES) >= 5  # schemas not written for specrt
    for case in CASES:
        jsonschema.validate(case.example, case.schema)
        constraint = pair_generator.compile_constraint(ConstraintSpec.json_schema(case.schema))
        ids = pair_generator.tokenizer.encode(json.dumps(case.example, separators=(",", ":")),
                                              add_special_tokens=False)
        assert constraint.valid_prefix(ids) == len(ids), case.name
        constraint.consume(ids)
        assert constraint.matcher.is_accepting(), case.name


def test_bench_rows_and_markdown(pair_generator):
    cases = tuple(c for c in CASES if c.name in ("boolean_flags", "flight"))
    result = run_json_bench(pair_generator, ("ngram", "draft"), 3, 80, 1, cases=cases, ablation=True,
                            short=True)  # the fixture bundle's context is 128 tokens
    rows = {r["label"]: r for r in result["rows"]}
    assert set(rows) == {"plain", "constrained plain", "ngram", "ngram no forced", "draft", "draft no forced"}
    base = rows["constrained plain"]
    assert base["stopped"] > 0  # at least one toy output finished inside the 80-token budget
    for label, row in rows.items():
        if label != "plain":
            # every constrained configuration emits exactly constrained plain's tokens, so it stops and validates
            # exactly as often (validity itself on the toy model: see docs/structured-output.md, limits)
            assert row["identical"] == 1.0, row
            assert (row["stopped"], row["valid"]) == (base["stopped"], base["valid"]), row
    assert rows["ngram"]["forced"] > 0 and rows["ngram no forced"]["forced"] == 0
    assert rows["ngram"]["tokens_per_pass"] > rows["constrained plain"]["tokens_per_pass"] == 1.0
    text = json_markdown(result, "JSON", "specrt bench X --suite json", "Machine: test.")
    assert "| constrained plain |" in text and "| ngram no forced |" in text


def test_cli_suite_json_refusals(pair_bundle):
    # (the full run needs a bundle with a context for the schema-bearing prompts: measured on SmolLM2, see
    # benchmarks/sections/json.md)
    proc = run_cli("bench", pair_bundle, "--suite", "json", "--methods", "medusa", "--quiet")
    assert proc.returncode == 2 and "not available" in proc.stderr
    proc = run_cli("bench", pair_bundle, "--suite", "json,code", "--quiet")
    assert proc.returncode == 2 and "runs alone" in proc.stderr


def test_bounded_schemas_end_runaway_values_and_keep_the_extracted_ones(pair_generator):
    """`bounded` (what the suite constrains with) refuses a digit run (int4 SmolLM2 wrote `1.1111...` for a
    latitude until max_new_tokens) and an endless string, yet accepts every case's example, which still
    validates against the original schema."""
    from specrt.bench.json_bench import bounded

    def accepted(schema, text):
        constraint = pair_generator.compile_constraint(ConstraintSpec.json_schema(schema))
        ids = pair_generator.tokenizer.encode(text, add_special_tokens=False)
        return constraint.valid_prefix(ids) == len(ids)

    geo = next(c for c in CASES if c.name == "geo_location")
    runaway = '{"latitude":1.' + "1" * 40
    assert accepted(geo.schema, runaway)  # the published schema allows it: nothing ends the loop
    assert not accepted(bounded(geo.schema), runaway)
    assert accepted(bounded(geo.schema), '{"latitude":45.8326,"longitude":6.8652}')
    huge = '{"deviceType":"phone","screenSize":1,"batteryCapacityMah":' + "3" * 20
    device = next(c for c in CASES if c.name == "device")
    assert accepted(device.schema, huge) and not accepted(bounded(device.schema), huge)
    assert bounded({"type": "integer", "minimum": 0, "enum": [1, 2]}) == {"type": "integer", "minimum": 0,
                                                                         "enum": [1, 2]}
    for case in CASES:
        example = json.dumps(case.example, separators=(",", ":"))
        assert accepted(bounded(case.schema), example), case.name
        jsonschema.validate(case.example, case.schema)
