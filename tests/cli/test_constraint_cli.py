"""`specrt generate --json-schema FILE | --json-object | --regex R | --grammar FILE`: the output follows the
constraint, equals constrained plain decoding, the stats line names it; bad constraints exit 2 in one line."""

import json
import re
import subprocess
import sys

import jsonschema

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["id", "ok"],
          "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}}


def specrt(*args):
    return subprocess.run([sys.executable, "-m", "specrt", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_generate_json_schema(pair_bundle, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    outs = []
    for method in ("none", "ngram"):
        proc = specrt("generate", pair_bundle, "--prompt", "x = ", "--max-new-tokens", 40, "--method", method,
                      "--json-schema", path, "--json")
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout))
        jsonschema.validate(json.loads(outs[-1]["text"]), SCHEMA)
    assert outs[0]["token_ids"] == outs[1]["token_ids"]
    assert outs[1]["stats"]["forced_tokens"] > 0 and outs[1]["stats"]["constraint"].startswith("json_schema")
    proc = specrt("generate", pair_bundle, "--prompt", "x = ", "--max-new-tokens", 40, "--json-schema", path)
    assert proc.returncode == 0 and "constraint json_schema, forced " in proc.stderr, proc.stderr


def test_generate_regex_and_grammar(pair_bundle, tmp_path):
    proc = specrt("generate", pair_bundle, "--prompt", "x = ", "--max-new-tokens", 20, "--regex", "[0-9]{3}-[a-z]{2}")
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", proc.stdout.strip()), proc.stdout
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text('root ::= "[" [a-c] ("," [a-c])? "]"\n')
    proc = specrt("generate", pair_bundle, "--prompt", "x = ", "--max-new-tokens", 20, "--grammar", gbnf)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"\[[a-c](,[a-c])?\]", proc.stdout.strip()), proc.stdout


def test_bad_constraints_exit_2(pair_bundle, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "strin"}')
    cases = [(["--json-schema", bad], "strin"), (["--json-schema", tmp_path / "missing.json"], "cannot read"),
             (["--regex", "(a"], "unclosed group"), (["--regex", "a", "--json-object"], "at most one")]
    for args, message in cases:
        proc = specrt("generate", pair_bundle, "--prompt", "x", "--max-new-tokens", 4, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
