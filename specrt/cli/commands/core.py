"""`specrt compile`, `specrt generate`, `specrt inspect`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specrt.cli.main import KType, echo_json, handle_errors, main
from specrt.cli.options import backend_option, method_option
from specrt.cli.quantize_options import quantize_compile_options
from specrt.cli.trt_options import trt_compile_options
from specrt.cli.progress import step_progress


def compile_spec(*, tolerance: str | None, trt_options: dict, quant_options: dict, **options):
    """`specrt compile`'s option values -> the `CompileSpec` that `compile_bundle` runs (InvalidArgument: exit 2)."""
    from specrt.compiler.spec import CompileSpec, EngineSpec, QuantizeSpec

    q = quant_options
    quantize = QuantizeSpec(target=q["quantize"], draft=q["draft_quantize"], block_size=q["quant_block_size"],
                            symmetric=q["quant_symmetric"], accuracy_level=q["quant_accuracy_level"],
                            batch_invariant=q["quant_batch_invariant"], calibration_data=q["calibration_data"],
                            max_ppl_increase=q["max_ppl_increase"])
    engines = EngineSpec(kind=trt_options["engines"], **{k: v for k, v in trt_options.items() if k != "engines"})
    if tolerance is not None:
        options["tolerance"] = tolerance  # "ATOL,RTOL", parsed by the spec
    return CompileSpec(quantize=quantize, engines=engines, **options)


@main.command("compile")
@click.option("--target", required=True, type=click.Path(path_type=Path),
              help="Target: a Hugging Face checkpoint directory, a .gguf file, or a .whl/.zip holding one .gguf.")
@click.option("--draft", type=click.Path(path_type=Path),
              help="Draft, same forms as --target (same tokenizer), or self:int4 / self:int8 (the quantized target "
                   "as the draft), or head:DIR (a draft head from `specrt train-head`).")
@click.option("--medusa", type=click.Path(path_type=Path), help="Medusa heads directory (see `specrt train-medusa`).")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path), help="Bundle directory to write.")
@click.option("--max-seq-len", default=2048, show_default=True, type=int, help="Context length (prompt + generated).")
@click.option("--max-draft-tokens", default=8, show_default=True, type=int, help="Largest k the bundle accepts.")
@click.option("--force", is_flag=True, help="Replace an existing bundle (or empty directory) at the output.")
@click.option("--ort-graph", type=click.Choice(["fused", "portable", "both"]), default="fused", show_default=True,
              help="fused: also write ONNX Runtime's fused graph (GroupQueryAttention, in-place KV cache) where the "
                   "architecture supports it (Llama, Mistral, Qwen2/3, Gemma 3); portable: only the standard-ops graph; "
                   "both: fused, and a quantized bundle keeps its quantized portable graph too (CUDA, TensorRT providers).")
@click.option("--keep-fp32", is_flag=True,
              help="A quantized bundle keeps its fp32 graphs too (the torch backend); by default it keeps only the "
                   "graphs ONNX Runtime runs.")
@click.option("--tolerance", default=None, metavar="ATOL,RTOL",
              help="ONNX-vs-PyTorch check per tensor: max|diff| <= ATOL + RTOL * max|ref|  [default: 1e-4,1e-3]")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@trt_compile_options
@quantize_compile_options
@handle_errors
def compile_cmd(target, draft, medusa, output, max_seq_len, max_draft_tokens, force, ort_graph, keep_fp32, tolerance,
                as_json, trt_options, quant_options):
    """Export target (and draft) to ONNX, validate, and write a bundle (with --engines trt: plus engines)."""
    from specrt.compiler import compile_bundle

    spec = compile_spec(target=target, draft=draft, medusa=medusa, output=output, max_seq_len=max_seq_len,
                        max_draft_tokens=max_draft_tokens, force=force, ort_graph=ort_graph, keep_fp32=keep_fp32,
                        tolerance=tolerance, trt_options=trt_options, quant_options=quant_options)
    with step_progress(enabled=not as_json) as progress:
        out = compile_bundle(spec, progress=progress)
    from specrt.cli.describe import bundle_summary

    summary = bundle_summary(out)
    if as_json:
        echo_json(summary)
    else:
        from specrt.cli.describe import human_size

        click.echo(f"wrote bundle {out} ({', '.join(summary['models'])}; max_seq_len={max_seq_len}, "
                   f"max_draft_tokens={max_draft_tokens}; {human_size(summary['bytes'])} in {summary['files']} "
                   "files: `specrt inspect` lists them)")


@main.command("generate")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompt", default=None, help="Prompt text (or --chat).")
@click.option("--chat", "chat", default=None, help="A user message, rendered with the bundle's chat template.")
@click.option("--system", default=None, help="A system message for --chat.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=None, type=float,
              help="0 = greedy (default: the bundle's generation_config, else 0).")
@click.option("--top-k", default=None, type=int, help="0 = off (default: the bundle's generation_config, else 0).")
@click.option("--top-p", default=None, type=float, help="1 = off (default: the bundle's generation_config, else 1).")
@click.option("--seed", default=None, type=int, help="Makes sampling reproducible.")
@method_option()
@click.option("--num-speculative-tokens", "k", default="auto", show_default=True, type=KType(),
              help="Tokens drafted per step, or 'auto' (adaptive).")
@click.option("--ngram-min", default=None, type=int, help="Shortest suffix n-gram to match (ngram method; 1..32).")
@click.option("--ngram-max", default=None, type=int, help="Longest suffix n-gram to match (ngram method; 1..32).")
@backend_option()
@click.option("--target-device", default=None, help="e.g. cpu, cuda:0")
@click.option("--draft-device", default=None, help="e.g. cpu, cuda:1")
@click.option("--threads", default=None, type=int, help="CPU threads per model (default: all cores).")
@click.option("--stream", is_flag=True, help="Print text as it is generated.")
@click.option("--strict", is_flag=True, help="Refuse (exit 2) when prompt + --max-new-tokens exceed the bundle's context "
                                              "(default: warn, stop at the context, finish_reason length).")
@click.option("--json", "as_json", is_flag=True, help='Print {"text", "token_ids", "finish_reason", "stats"} as JSON.')
@click.option("--json-schema", "json_schema", default=None, type=click.Path(path_type=Path),
              help="Constrain the output to this JSON schema (a file; see docs/structured-output.md).")
@click.option("--json-object", "json_object", is_flag=True, help="Constrain the output to any JSON object.")
@click.option("--regex", default=None, help="Constrain the whole output to match this regular expression.")
@click.option("--grammar", default=None, type=click.Path(path_type=Path),
              help="Constrain the output to this grammar (a file: Lark / llguidance EBNF, or GBNF).")
@handle_errors
def generate_cmd(bundle, prompt, chat, system, max_new_tokens, temperature, top_k, top_p, seed, method, k, ngram_min,
                 ngram_max, backend, target_device, draft_device, threads, stream, strict, as_json, json_schema,
                 json_object, regex, grammar):
    """Generate text from BUNDLE with speculative decoding."""
    from specrt.core.errors import InvalidArgument
    from specrt.core.tokenizer import IncrementalDecoder
    from specrt.cli.generate_output import context_warning, stats_line
    from specrt.runtime import load

    if (prompt is None) == (chat is None):
        raise InvalidArgument("give exactly one of --prompt and --chat")
    if system is not None and chat is None:
        raise InvalidArgument("--system needs --chat")
    from specrt.runtime.arguments import check_text

    for flag, text in (("--chat", chat), ("--system", system)):
        if text is not None:
            check_text(text, flag)
    from specrt.cli.constraint_options import constraint_from_options

    constraint = constraint_from_options(json_schema, json_object, regex, grammar)
    with loading_status(bundle):
        gen = load(bundle, backend=backend, threads=threads, target_device=target_device,
                   draft_device=draft_device, warmup=False)  # one call: time the shapes only if it needs them
    if chat is not None:
        from specrt.runtime.chat_template import ChatFormatter, chat_prompt_ids

        formatter = ChatFormatter.from_manifest(gen.manifest)
        if formatter.kind == "plain":
            click.echo("note: the bundle has no chat template: using the plain 'role: content' format", err=True)
        prompt = chat_prompt_ids(gen, chat, system, formatter)
    kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, method=method,
                  num_speculative_tokens=k, ngram_min=ngram_min, ngram_max=ngram_max, strict=strict,
                  constraint=constraint)
    if stream and not as_json:
        dec, stats = IncrementalDecoder(gen.tokenizer), None
        for chunk, stats in gen.stream_tokens(prompt, max_new_tokens, **kwargs):
            sys.stdout.write(dec.push(chunk) or "")
            sys.stdout.flush()
        sys.stdout.write(dec.flush() + "\n")
        sys.stdout.flush()
    else:
        res = gen.generate(prompt, max_new_tokens, **kwargs)
        stats = res.stats
        if as_json:
            echo_json({"text": res.text, "token_ids": res.token_ids, "finish_reason": res.finish_reason,
                       "stats": stats.to_dict()})
        else:
            click.echo(res.text)
    warning = context_warning(stats, max_new_tokens, gen.max_seq_len)
    if warning:
        click.echo(warning, err=True)
    if not as_json:
        click.echo(stats_line(stats), err=True)


def loading_status(bundle: Path):
    """A transient 'loading BUNDLE...' line on a terminal's stderr (nothing when stderr is a pipe or a file)."""
    import contextlib

    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        return contextlib.nullcontext()
    return console.status(f"loading {bundle} (checking checksums, creating ONNX Runtime sessions)...")


@main.command("inspect")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--memory", is_flag=True, help="Print the memory plan per model and device.")
@click.option("--max-seq-len", default=None, type=int, help="Context length for the memory plan.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def inspect_cmd(bundle, memory, max_seq_len, as_json):
    """Describe a bundle: models, graph I/O, profiles, engines, checksums."""
    from specrt.cli.describe import bundle_summary, print_summary

    summary = bundle_summary(bundle, memory=memory, max_seq_len=max_seq_len)
    if as_json:
        echo_json(summary)
    else:
        print_summary(summary)
    if summary["failed_checks"]:  # described above, but still refused by generate/serve/bench
        from specrt.cli.main import fail

        fail(f"bundle {bundle} failed {len(summary['failed_checks'])} check(s) (marked FAILED): generate, serve "
             "and bench refuse it wherever they open a failed file; recompile it with `specrt compile`", 2)
