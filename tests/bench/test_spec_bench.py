"""`specrt bench --suite spec-bench[:FILE]`: the shipped question file, picking per category, MT-bench's second
turn, and the per-category table on the toy bundle with a tiny question file."""

import json

import pytest

from helpers import run_cli
from specrt.bench.spec_bench import load_questions

TINY = [
    {"question_id": 1, "category": "writing", "turns": ["cat", "ok"]},
    {"question_id": 2, "category": "qa", "turns": ["one two three one two three"]},
    {"question_id": 3, "category": "qa", "turns": ["hello world hello"]},
    {"question_id": 4, "category": "rag", "turns": ["word " * 200]},  # does not fit the 64-token context
]


def test_the_shipped_questions_are_spec_bench():
    qs = load_questions()
    cats = {}
    for q in qs:
        cats[q.category] = cats.get(q.category, 0) + 1
    assert cats == {"mt_bench": 80, "translation": 80, "summarization": 80, "qa": 80, "math_reasoning": 80, "rag": 80}
    assert all(len(q.turns) == 2 for q in qs if q.category == "mt_bench")


def test_suite_table_on_a_tiny_file(target_only_bundle, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in TINY) + "\n")
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    r = run_cli("bench", target_only_bundle, "--suite", f"spec-bench:{path}", "--per-category", "1",
                "--methods", "ngram,recycle", "--max-new-tokens", "6", "--json", out, "--markdown", md, "--quiet")
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    rows = {(row["method"], row["category"]): row for row in result["rows"]}
    assert set(rows) == {(m, c) for m in ("ngram", "recycle") for c in ("mt_bench", "qa", "overall")}
    assert rows[("recycle", "mt_bench")]["prompts"] == 2  # both turns; the second with the first answer as history
    assert rows[("ngram", "qa")]["prompts"] == 1  # one per category
    assert result["skipped_too_long"] == 1  # the rag question does not fit
    for row in result["rows"]:
        assert row["identical"] == row["prompts"]  # greedy: every output is plain's
        assert row["mat"] >= 1.0 and row["speedup"] > 0
    text = md.read_text()
    assert "| method | mt_bench | qa | overall | identical to plain |" in text and "| recycle |" in text


def test_bad_question_file_is_one_line(target_only_bundle, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"category": "qa"}\n')
    r = run_cli("bench", target_only_bundle, "--suite", f"spec-bench:{path}", "--quiet")
    assert r.returncode != 0 and "bad.jsonl:1" in r.stderr and "Traceback" not in r.stderr


def test_a_question_file_that_is_no_regular_file_is_one_clear_error(tmp_path):
    """--suite spec-bench:FILE reads FILE as the other command-line files are read: a FIFO or a device is refused
    before anything is read (it hung, or read /dev/zero until memory ran out)."""
    import os

    from specrt.bench.spec_bench import load_questions
    from specrt.core.errors import InvalidArgument

    fifo = tmp_path / "q.jsonl"
    os.mkfifo(fifo)
    for path, what in ((fifo, "FIFO"), ("/dev/zero", "character device")):
        with pytest.raises(InvalidArgument, match=what):
            load_questions(path)


def test_free_rows_measures_auto_mat_only(target_only_bundle, tmp_path):
    """--free-rows: method auto with every pass priced as one row (tests/runtime/test_auto.py: its trees fill the
    node cap); the table is MAT only, outputs still plain's; other methods and suites are refused."""
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in TINY[:3]) + "\n")
    rows = {}
    for flag in ((), ("--free-rows",)):
        out = tmp_path / f"r{len(flag)}.json"
        md = tmp_path / f"r{len(flag)}.md"
        r = run_cli("bench", target_only_bundle, "--suite", f"spec-bench:{path}", "--per-category", "1",
                    "--methods", "auto", "--max-new-tokens", "12", "--json", out, "--markdown", md, "--quiet", *flag)
        assert r.returncode == 0, r.stderr
        result = json.loads(out.read_text())
        assert result["methods"] == ["auto"] and result["free_rows"] == bool(flag)
        rows[bool(flag)] = {row["category"]: row for row in result["rows"]}
        assert all(row["identical"] == row["prompts"] for row in result["rows"])
    # the toy model's rows are nearly free anyway: its trees are as big as its candidates allow either way
    assert rows[True]["overall"]["rows_per_pass"] >= rows[False]["overall"]["rows_per_pass"] > 1
    text = (tmp_path / "r1.md").read_text()
    assert "MAT at a free-rows budget" in text and "speeds not measured" in text and "x (" not in text
    r = run_cli("bench", target_only_bundle, "--suite", f"spec-bench:{path}", "--methods", "ngram", "--free-rows")
    assert r.returncode != 0 and "--free-rows measures method auto" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("bench", target_only_bundle, "--suite", "code", "--free-rows")
    assert r.returncode != 0 and "--free-rows" in r.stderr and "Traceback" not in r.stderr


def test_each_method_starts_from_the_table_its_own_runs_left(target_only_bundle, monkeypatch):
    """recycle and auto share the bundle's successor table; in one Spec-Bench run each starts every question from
    what its own earlier runs taught it, never from the table the other method just refreshed on that very
    question's answer (which inflated the second method's MAT)."""
    import numpy as np

    import specrt.bench.measure as measure
    from specrt.bench.spec_bench import Question, run_spec_bench
    from specrt.runtime import load
    from specrt.runtime.proposers.recycle_table import table_for

    gen = load(target_only_bundle, threads=1)
    table = table_for(gen)
    seen = []  # (method, table before its run, table after)
    real = measure.run_once

    def spy(gen_, ids, n, method, k, params, proposer=None):
        before = table.succ.copy()
        res = real(gen_, ids, n, method, k, params)
        seen.append((method, before, table.succ.copy()))
        return res

    monkeypatch.setattr(measure, "run_once", spy)
    questions = [Question("qa", ("one two three one two three",)), Question("qa", ("hello world hello",)),
                 Question("rag", ("the cat sat on the mat and the cat",))]
    run_spec_bench(gen, ["recycle", "auto"], questions, max_new_tokens=12)
    last, changed = {}, 0
    for method, before, after in seen:
        if method == "none":
            assert np.array_equal(before, after)  # plain runs read and write no table
            continue
        if method in last:
            assert np.array_equal(before, last[method]), method
        changed += not np.array_equal(before, after)
        last[method] = after
    assert changed > 0  # the runs did refresh the table: the check above is not vacuous


def test_auto_source_labels_are_rows_of_one_run(target_only_bundle, tmp_path):
    """--methods 'ngram,auto[ngram],auto' (specrt/bench/method_label.py): auto with auto_sources=ngram is its own row;
    a label with sources the bundle lacks, or brackets on another method, is one clear line before anything runs."""
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in TINY) + "\n")
    out = tmp_path / "r.json"
    r = run_cli("bench", target_only_bundle, "--suite", f"spec-bench:{path}", "--per-category", "1",
                "--methods", "ngram,auto[ngram],auto", "--max-new-tokens", "6", "--json", out, "--quiet")
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert result["methods"] == ["ngram", "auto[ngram]", "auto"]
    assert {row["method"] for row in result["rows"]} == {"ngram", "auto[ngram]", "auto"}
    assert all(run["identical"] for run in result["runs"])
    for methods, says in (("auto[head]", "error: --methods auto[head]: auto source 'head' is not available"),
                          ("ngram[x]", "only method auto takes sources in brackets"),
                          ("auto[bogus]", "error: --methods auto[bogus]: unknown auto source 'bogus'")):
        r = run_cli("bench", target_only_bundle, "--suite", f"spec-bench:{path}", "--methods", methods, "--quiet")
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (methods, r.stderr)


def test_each_auto_label_learns_its_own_estimates(target_only_bundle):
    """auto[ngram] and auto in one run each keep their own auto state (pass costs, acceptance estimates): the
    successor table's candidates are scored only in auto's, never in auto[ngram]'s (which proposes none)."""
    from specrt.bench.spec_bench import MethodTables
    from specrt.runtime import load
    from specrt.runtime.proposers.auto import state_for

    gen = load(target_only_bundle, threads=1)
    prompt = "the cat sat on the mat and the cat sat on the"
    gen.generate(prompt, 24, method="recycle")  # the table learns this answer's successors (each label's copy too)
    tables = MethodTables(gen, ["ngram", "auto[ngram]", "auto"])
    states = {}
    for label, sources in (("auto[ngram]", "ngram"), ("auto", None)):
        with tables.of(label):
            gen.generate(prompt, 24, auto_sources=sources)
            states[label] = state_for(gen)
    with tables.of("auto[ngram]"):
        assert state_for(gen) is states["auto[ngram]"]  # kept across its runs
    assert states["auto[ngram]"] is not states["auto"]
    sources = {label: {key[0] for key in s.stats.counts} for label, s in states.items()}
    assert sources["auto"] & {"table", "tablep"} and not sources["auto[ngram]"] & {"table", "tablep"}, sources
