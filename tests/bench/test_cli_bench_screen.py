"""`specrt bench` as a newcomer meets it (issue 15): optional dependencies checked before measuring,
results written before the plot, no progress bar before a path error, tables that fit 80 columns."""

import json
import os
import subprocess
import sys
import time

SMALL = ["--repeats", "1", "--max-new-tokens", "8", "--prompts-per-suite", "1", "--suite", "code",
         "--methods", "draft", "--k", "2"]


def run(args, block=(), columns=None):
    """`specrt bench ...` in a subprocess; modules in `block` cannot be imported there (as if not installed)."""
    code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in block) +
            "from specrt.cli.main import main\nmain(prog_name='specrt')")
    env = {**os.environ, **({"COLUMNS": str(columns)} if columns else {})}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, "bench", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)
    return proc, time.perf_counter() - started


def test_missing_optional_dependencies_fail_before_measuring(pair_bundle, tmp_path):
    for flags, module, needle in ((["--plot", tmp_path / "p.png"], "matplotlib", "--plot needs matplotlib"),
                                  (["--peer", "hf"], "transformers", "--peer hf needs transformers")):
        proc, _ = run([pair_bundle, *SMALL, "--json", tmp_path / "r.json", *flags], block=[module])
        assert proc.returncode == 2
        assert proc.stderr == f"error: {needle}, which is not installed: pip install 'specrt[bench]'\n"
        assert not (tmp_path / "r.json").exists()  # nothing was measured


def test_results_are_written_before_a_failing_plot(pair_bundle, tmp_path):
    js, md = tmp_path / "r.json", tmp_path / "r.md"
    proc, _ = run([pair_bundle, *SMALL, "--quiet", "--json", js, "--markdown", md,
                   "--plot", tmp_path / "no-such-dir" / "p.png"])
    assert proc.returncode != 0 and proc.stderr.startswith("error: ")
    assert json.loads(js.read_text())["results"] and md.read_text().startswith("## Benchmark")


def test_path_error_shows_no_progress_bar(tmp_path, pair_bundle):
    proc, _ = run([tmp_path / "missing"])
    assert proc.returncode == 2
    assert proc.stderr == f"error: bundle {tmp_path / 'missing'} does not exist (create one with `specrt compile`)\n"
    proc, _ = run([pair_bundle, "--k", 99])  # found after loading the bundle: still no bar before it
    assert proc.returncode == 2 and proc.stderr.startswith("error: --k 99 is outside [1, 8]")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_tables_fit_80_columns_and_wide_shows_every_column(pair_bundle):
    proc, _ = run([pair_bundle, *SMALL], columns=80)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), proc.stdout
    assert "…" not in proc.stdout
    header = next(line for line in lines if line.split()[:1] == ["config"])
    assert header.split() == ["config", "tok/s", "speedup", "acc", "pred", "eff", "same"]
    proc, _ = run([pair_bundle, *SMALL, "--wide"], columns=80)
    assert proc.returncode == 0 and "…" not in proc.stdout
    for col in ("a/token", "V(k)/V(0)", "draft/verify %", "e2e speedup", "tokens/step"):
        assert col in proc.stdout, col


def test_tables_at_exactly_100_columns_cut_nothing(pair_bundle):
    """At 100 columns the full headers did not fit and rich cut cells ("speed…"): the table falls back to the
    short headers whenever its natural width exceeds the terminal's."""
    for columns in (100, 101, 140):
        args = [a if a != "draft" else "draft,hybrid" for a in SMALL]  # an option given twice is refused
        proc, _ = run([pair_bundle, *args], columns=columns)
        assert proc.returncode == 0, proc.stderr
        assert "…" not in proc.stdout, proc.stdout
        assert all(len(line) <= columns for line in proc.stdout.splitlines()), proc.stdout


def test_auto_source_labels_show_in_the_terminal_table(pair_bundle):
    """`--methods 'auto[ngram],auto'`: each row names its sources (rich read `[ngram]` as markup and dropped it,
    so both rows read `auto k=auto`)."""
    args = [*SMALL[:-4], "--methods", "auto[ngram],auto[ngram,recycle],auto", "--k", "auto"]
    proc, _ = run([pair_bundle, *args], columns=120)
    assert proc.returncode == 0, proc.stderr
    configs = [line.split()[0] for line in proc.stdout.splitlines() if line.strip().startswith("auto")]
    assert configs == ["auto[ngram]", "auto[ngram,recycle]", "auto"] * 2, proc.stdout  # suite code, then overall
