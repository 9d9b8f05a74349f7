"""`specrt compile`, `specrt inspect` (`specrt generate`: commands/generate.py)."""

from __future__ import annotations

from pathlib import Path

import click

from specrt.cli.main import echo_json, handle_errors, main
from specrt.cli.quantize_options import quantize_compile_options
from specrt.cli.trt_options import trt_compile_options
from specrt.compiler.quantize_prepare import prepare_quantization
from specrt.compiler.trt.compile_steps import prepare_trt_compile
from specrt.compiler.trt.ptq import PTQ_PRECISIONS
from specrt.cli.progress import step_progress


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
    from specrt.compiler.pipeline import check_compile_args
    from specrt.compiler.input_check import check_checkpoint_dir
    from specrt.compiler.draft_head import head_dir_of
    from specrt.compiler.validate import Tolerance

    trt_options = trt_options | {k: quant_options[k] for k in ("calibration_data", "max_ppl_increase")}
    head = head_dir_of(draft)  # head:DIR: a draft head, compiled by compile_bundle's draft-head step
    if head is not None:
        from specrt.models.draft_head import read_head_config

        read_head_config(head)
        draft = None
    plan, draft = prepare_quantization(quant_options, draft, trt_backend=trt_options.get("engines") == "trt",
                                       trt_ptq=trt_options.get("precision") in PTQ_PRECISIONS)
    for flag, path in (("--target", target), ("--draft", draft), ("--medusa", medusa)):
        if path is not None:
            check_checkpoint_dir(path, flag)
    inputs = (target, draft, medusa, head)
    check_compile_args(max_seq_len, max_draft_tokens, output, force, inputs)
    tol = Tolerance.parse(tolerance) if tolerance is not None else None
    extra = []
    if medusa is not None:
        from specrt.compiler.medusa import medusa_step

        extra.append(medusa_step(medusa, target))
    extra += prepare_trt_compile(trt_options, target=target, draft=draft, output=output,
                                 max_seq_len=max_seq_len, max_draft_tokens=max_draft_tokens)
    with step_progress(enabled=not as_json) as progress:
        draft_arg = f"head:{head}" if head is not None else draft
        out = compile_bundle(target, output, draft_arg, max_seq_len=max_seq_len, max_draft_tokens=max_draft_tokens,
                             force=force, tolerance=tol, progress=progress, extra_steps=extra, inputs=(medusa,),
                             ort_graph=ort_graph, quantization=plan, keep_fp32=keep_fp32)
    from specrt.cli.describe import bundle_summary

    summary = bundle_summary(out)
    if as_json:
        echo_json(summary)
    else:
        from specrt.cli.describe import human_size

        click.echo(f"wrote bundle {out} ({', '.join(summary['models'])}; max_seq_len={max_seq_len}, "
                   f"max_draft_tokens={max_draft_tokens}; {human_size(summary['bytes'])} in {summary['files']} "
                   "files: `specrt inspect` lists them)")


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
