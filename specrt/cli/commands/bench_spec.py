"""`specrt bench BUNDLE --suite spec-bench[:FILE]` (specrt/bench/spec_bench.py): Spec-Bench's per-category table."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from specrt.bench.spec_bench import SUITE


def is_spec_bench(suites) -> bool:
    return any(s == SUITE or s.startswith(SUITE + ":") for s in suites or ())


def spec_bench_suite(bundle, suites, methods, ks, max_new_tokens, per_category, backend, threads, md_path, json_path,
                     title, quiet, free_rows: bool = False) -> None:
    """Runs the suite; prints the table (Markdown), writes --markdown / --json when given. `free_rows`: method auto
    with every pass priced as one row (runtime/proposers/auto.py `use_free_rows`), MAT only."""
    from specrt.bench.method_label import check_labels
    from specrt.bench.spec_bench import load_questions, markdown, pick, run_spec_bench
    from specrt.core.errors import InvalidArgument
    from specrt.runtime import load

    if len(suites) != 1:
        raise InvalidArgument("--suite spec-bench runs alone (its own questions and table): drop the other suites")
    if click.get_current_context().get_parameter_source("ks") == click.core.ParameterSource.DEFAULT:
        ks = ("auto",)  # the k sweep's default list: here adaptive k, as users run it
    if len(ks) != 1:
        raise InvalidArgument(f"--suite spec-bench measures one k per method (an integer or auto), got {len(ks)}: "
                              "give --k once")
    if free_rows and methods and tuple(methods) != ("auto",):
        raise InvalidArgument(f"--free-rows measures method auto (its cost model), got --methods {','.join(methods)}: "
                              "give --methods auto or leave --methods out")
    path = suites[0][len(SUITE) + 1:] or None
    questions = load_questions(Path(path) if path else None)  # a bad file fails before the bundle loads
    gen = load(bundle, backend=backend, threads=threads)
    methods = ["auto"] if free_rows else [m for m in (methods or gen.methods) if m != "none"]
    check_labels(gen, methods)  # a method, or auto[SOURCES] (specrt/bench/method_label.py)
    picked, skipped = pick(gen, questions, per_category, max_new_tokens)
    if not picked:
        raise InvalidArgument(f"no question fits the bundle's context ({gen.max_seq_len} tokens) with "
                              f"--max-new-tokens {max_new_tokens}")
    report = None if quiet else (lambda line: click.echo(line, err=True))
    if free_rows:
        from specrt.runtime.proposers.auto import use_free_rows

        use_free_rows(gen)
    result = run_spec_bench(gen, methods, picked, max_new_tokens, ks[0], progress=report, mat_only=free_rows)
    result["free_rows"] = free_rows
    result["skipped_too_long"] = skipped
    result["command"] = "specrt bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 1 else None
    text = markdown(result, title or ("Spec-Bench: MAT at a free-rows budget" if free_rows else "Spec-Bench"))
    if skipped:
        text += f"\n{skipped} question(s) skipped: prompt + {max_new_tokens} new tokens exceed the bundle's context.\n"
    if md_path is not None:
        Path(md_path).write_text(text, encoding="utf-8")
    if json_path is not None:
        out = json.dumps(result, indent=2, default=str) + "\n"
        sys.stdout.write(out) if str(json_path) == "-" else Path(json_path).write_text(out, encoding="utf-8")
    if not quiet and str(json_path) != "-":
        click.echo(text)
