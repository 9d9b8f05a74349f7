"""The Spec-Bench section's Markdown (scripts/spec_bench_report.py) from the JSON its script writes: goals met / not
met by the measured numbers, the bound speedup <= MAT / (T(S)/T(1)) at the interpolated pass cost, the leaderboard's
figures marked as other hardware, and a section that the real `specrt bench --suite spec-bench` JSON feeds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import spec_bench_report as report  # noqa: E402

CATS = ("mt_bench", "qa")


def result(methods: dict[str, tuple[float, float]], rows_per_pass: float = 3.0, identical: bool = True) -> dict:
    """A `specrt bench --suite spec-bench` result: per method (speedup, MAT) in every category and overall."""
    rows = []
    for m, (speed, mat) in methods.items():
        for c in (*CATS, "overall"):
            rows.append({"method": m, "category": c, "prompts": 2, "speedup": speed, "mat": mat,
                         "rows_per_pass": rows_per_pass, "identical": 2 if identical else 1})
    return {"methods": list(methods), "rows": rows, "questions": 2, "max_new_tokens": 16}


def data(auto_fp32=1.8, auto_int4=1.2, self_auto=1.3, self_draft=1.4, identical=True, demo_worst=0.99) -> dict:
    costs = {"rows": [1, 2, 3, 4, 5], "ratio": [1.0, 1.1, 1.2, 1.3, 1.4], "seconds": [0.02] * 5, "past": 300,
             "default_method": "auto", "draft_over_target": None}
    return {
        "fp32": result({"ngram": (1.5, 1.6), "recycle": (1.4, 1.7), "auto": (auto_fp32, 2.0)}, identical=identical),
        "int4": result({"ngram": (1.3, 1.6), "recycle": (1.1, 1.7), "auto": (auto_int4, 1.9)}),
        "self": result({"ngram": (1.2, 1.6), "draft": (self_draft, 2.2), "auto": (self_auto, 2.0)}),
        "fp32_free": result({"auto": (1.0, 2.6)}, rows_per_pass=5.0),
        "int4_free": result({"auto": (1.0, 2.5)}, rows_per_pass=5.0),
        "self_free": result({"auto": (1.0, 2.7)}, rows_per_pass=5.0),
        "open": result({"ngram": (1.0, 1.1), "auto": (1.1, 1.2)}),
        "demo": {"rows": [{"kind": "open", "first": 1.0, "min": demo_worst, "median": 1.0, "decode_min": 1.0,
                           "decode_median": 1.0, "mat": 1.1, "identical": True}], "worst": demo_worst,
                 "repeats": 1, "max_new_tokens": 16, "load_average": 1.0},
        "costs": {"fp32": costs, "int4": costs, "self": dict(costs, draft_over_target=0.42)},
        "meta": {"command": "python scripts/spec_bench_section.py", "date": "today", "minutes": 1.0, "cores": 2,
                 "cpu": "cpu", "load_average": 1.0, "runs": ["specrt bench x"]},
    }


def goal_lines(text: str) -> dict[str, str]:
    return {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ") and "**" in line}


def test_goals_follow_the_numbers():
    text = report.section(data())
    lines = goal_lines(text)
    assert "**met**" in lines["| fp32 target only, default method (`auto`): mean >= 1.7x"]
    assert "**not met**" in lines["| int4 target only, default method (`auto`): mean >= 1.7x"]
    assert "**not met**" in lines["| open chat prompts outside Spec-Bench, fp32 `auto` >= 1.2x"]
    self_line = lines["| `--draft self:int4`: its default (`auto`) >= the best of its methods in every category"]
    assert "**not met**" in self_line and "mt_bench: auto 1.30x < draft 1.40x" in self_line
    ngram_line = lines["| every category at least n-gram's speedup (`auto` vs `ngram`, each bundle)"]
    assert "int4 qa 1.20x < 1.30x" in ngram_line and "fp32" not in ngram_line.split(" | ")[1]
    assert "**met**" in lines["| outputs identical to plain on every question"]
    assert "**met**" in lines["| `auto` >= 0.97x plain on every demo prompt (every run)"]
    better = goal_lines(report.section(data(self_auto=1.5, identical=False, demo_worst=0.9)))
    assert "**met**" in better["| `--draft self:int4`: its default (`auto`) >= the best of its methods in every category"]
    assert "**not met**" in better["| outputs identical to plain on every question"]
    assert "**not met**" in better["| `auto` >= 0.97x plain on every demo prompt (every run)"]


def test_the_bound_divides_mat_by_the_interpolated_row_cost():
    text = report.section(data())
    # fp32 auto: MAT 2.0 at 3 rows per pass, T(3)/T(1) = 1.2: bound 1.67x; the goal 1.25x needs MAT 1.50 there;
    # free rows: MAT 2.6 at 5 rows, T(5)/T(1) = 1.4: 1.86x
    assert "| qa | 2.00 | 3.00 | 1.20 | 1.67x | 1.80x | 1.50 (goal 1.25x) | 2.60 (5.0) | 1.86x |" in text
    assert report.cost_at({"rows": [1, 2, 3], "ratio": [1.0, 1.2, 1.6]}, 2.5) == pytest.approx(1.4)
    assert "Not comparable with the rows above" in text and "fd2c1cd" in text and "| 2.73 | 2.22x |" in text
    assert "one step of the int4 draft costs 0.42" in text


def test_a_section_from_real_spec_bench_runs(target_only_bundle, tmp_path):
    """The JSON `specrt bench --suite spec-bench` writes (with and without --free-rows) is what the report reads."""
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"category": "qa", "turns": ["one two three one two three"]}) + "\n")
    real = {}
    for key, extra in (("fp32", ("--methods", "ngram,recycle,auto")), ("fp32_free", ("--free-rows",))):
        out = tmp_path / f"{key}.json"
        r = run_cli("bench", target_only_bundle, "--suite", f"spec-bench:{path}", "--per-category", "1",
                    "--max-new-tokens", "8", "--json", out, "--quiet", *extra)
        assert r.returncode == 0, r.stderr
        real[key] = json.loads(out.read_text())
    d = data()
    d.update(real)
    text = report.section(d)
    assert "| fp32 target only, default method (`auto`): mean >= 1.7x |" in text
    assert "#### fp32, target only" in text and "| recycle |" in text


def with_head(auto: float, identical: bool = True) -> dict:
    """data() plus the head bundle's run (issue #52): ngram, auto without the head, auto with it."""
    d = data()
    d["head"] = result({"ngram": (1.1, 1.2), "auto[-head]": (1.2, 1.3), "auto": (auto, 1.8)}, identical=identical)
    return d


def test_the_head_bundle_gets_its_table_and_the_52_goal_line():
    text = report.section(with_head(1.56))
    assert "#### fp32 with its fused draft head (`--draft head:DIR`)" in text
    assert "| auto[-head] | 1.20x (1.30) |" in text  # the standard table, a row per label
    # the per-category comparison: ngram, without, with, with / without (1.56 / 1.20 = 1.30)
    assert "| mt_bench | 1.10x (1.20) | 1.20x (1.30) | 1.56x (1.80) | 1.30x |" in text
    assert "| qa | 1.10x (1.20) | 1.20x (1.30) | 1.56x (1.80) | 1.30x |" in text
    line = goal_lines(text)["| #52: conversation (mt_bench) and qa with the head >= 1.25x the tree without it (fp32), "
                            "outputs identical"]
    assert "mt_bench 1.30x; qa 1.30x" in line and "**met**" in line
    slower = goal_lines(report.section(with_head(1.32)))
    line = slower["| #52: conversation (mt_bench) and qa with the head >= 1.25x the tree without it (fp32), "
                  "outputs identical"]
    assert "mt_bench 1.10x; qa 1.10x" in line and "**not met**" in line
    differs = goal_lines(report.section(with_head(1.56, identical=False)))
    assert "**not met**" in differs["| outputs identical to plain on every question"]
    assert "NOT identical" in differs["| #52: conversation (mt_bench) and qa with the head >= 1.25x the tree without "
                                      "it (fp32), outputs identical"]


def test_no_head_bundle_no_head_lines():
    text = report.section(data())
    assert "#52" not in text and "draft head" not in text


def test_the_section_script_composes_the_head_run(tmp_path):
    """scripts/spec_bench_section.py --compose-only with SPEC_HEAD set reads spec_bench_head.json; unset, ignores it."""
    import os
    import subprocess

    d = with_head(1.56)
    names = {"open": "spec_bench_open_fp32.json", "demo": "spec_bench_demo.json", "costs": "spec_bench_row_costs.json",
             "meta": "spec_bench_meta.json"}
    for key, value in d.items():
        (tmp_path / names.get(key, f"spec_bench_{key}.json")).write_text(json.dumps(value))
    script = Path(__file__).resolve().parents[2] / "scripts" / "spec_bench_section.py"
    args = [sys.executable, str(script), "--fp32", "a", "--int4", "b", "--self", "c", "--out", str(tmp_path),
            "--compose-only"]
    for head, md in (("h", tmp_path / "with.md"), ("", tmp_path / "without.md")):
        env = dict(os.environ, SPEC_HEAD=head)
        r = subprocess.run(args + ["--markdown", str(md)], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert "| #52: conversation (mt_bench) and qa" in (tmp_path / "with.md").read_text()
    assert "#52" not in (tmp_path / "without.md").read_text()


def test_the_datastore_bundle_gets_its_table_and_share():
    """The fp32 bundle with a datastore (issue #51): its own table, and auto without / with the datastore."""
    d = data()
    d["store"] = result({"ngram": (1.1, 1.2), "auto[-store]": (1.25, 1.3), "auto": (1.5, 1.9)})
    text = report.section(d)
    assert "#### fp32 with a datastore of its own answers (`specrt store --answers builtin`)" in text
    assert "| auto[-store] | 1.25x (1.30) |" in text
    assert "| category | ngram | auto without the datastore (`auto[-store]`) | auto with the datastore |" in text
    assert "| qa | 1.10x (1.20) | 1.25x (1.30) | 1.50x (1.90) | 1.20x |" in text  # 1.5 / 1.25
    assert "datastore" not in report.section(data())
    goals = goal_lines(text)  # the fp32 goals for the bundle with the datastore too: 1.5 < 1.7, every category 1.5
    assert "**not met**" in goals["| fp32 with its datastore, default method (`auto`): mean >= 1.7x"]
    assert "**met**" in goals["| fp32 with its datastore: every category >= 1.25x"]
    assert "int4 with its datastore" not in text


def test_the_datastore_goal_lines_open_chat_and_int4():
    """With the open chat prompts run on the datastore bundle, its own goal line (auto against auto[-store] in the
    same run); an int4 bundle with a datastore gets int4's goals and its own table; a datastore bundle whose auto
    loses to n-gram in a category is named in the n-gram line."""
    d = data()
    d["store"] = result({"ngram": (1.1, 1.2), "auto[-store]": (1.25, 1.3), "auto": (1.5, 1.9)})
    d["open_store"] = result({"ngram": (1.0, 1.1), "auto[-store]": (1.05, 1.3), "auto": (1.3, 1.7)})
    d["store_int4"] = result({"ngram": (1.4, 1.6), "auto[-store]": (1.5, 1.9), "auto": (1.36, 2.0)})
    text = report.section(d)
    goals = goal_lines(text)
    line = next(v for k, v in goals.items() if k.startswith("| the same, fp32 with a datastore"))
    assert "1.30x (MAT 1.70); without it, same run: 1.05x (MAT 1.30) | **met**" in line
    assert "**not met**" in goals["| int4 with its datastore, default method (`auto`): mean >= 1.7x"]
    assert "**met**" in goals["| int4 with its datastore: every category >= 1.35x"]  # 1.36 everywhere
    assert "#### int4 with a datastore of its own answers (`specrt store --answers builtin`)" in text
    below = goals["| every category at least n-gram's speedup (`auto` vs `ngram`, each bundle)"]
    assert "store_int4 qa 1.36x < 1.40x" in below and "**not met**" in below


def test_resume_keeps_the_measured_times_of_the_kept_runs():
    """--resume: a kept file's run line keeps the seconds the earlier run recorded; minutes add every run's; with
    nothing measured now the date and load average stay the earlier run's."""
    import spec_bench_section as sec

    before = {"runs": ["a  # 60 s", "b  # 120 s", "c  # kept from an earlier run"], "date": "then", "load_average": 2.0}
    now = {"runs": ["a  # kept from an earlier run", "b  # kept from an earlier run", "c  # kept from an earlier run"],
           "date": "now", "load_average": 0.0, "minutes": 0.0}
    out = sec.carried_over(now, before)
    assert out["runs"] == ["a  # 60 s", "b  # 120 s", "c  # kept from an earlier run"]
    assert out["minutes"] == 3.0 and out["date"] == "then" and out["load_average"] == 2.0
    measured = sec.carried_over(dict(now, runs=["a  # kept from an earlier run", "b  # 30 s", "d  # 30 s"]), before)
    assert measured["runs"] == ["a  # 60 s", "b  # 30 s", "d  # 30 s"] and measured["minutes"] == 2.0
    assert measured["date"] == "now"
