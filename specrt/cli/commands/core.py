"""`specrt compile`, `specrt inspect` (`specrt generate`: commands/generate.py)."""

from __future__ import annotations

from pathlib import Path

import click

from specrt.cli.main import echo_json, handle_errors, main
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
                   "architecture supports it (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, SmolLM3, Granite); portable: only the standard-ops graph; "
                   "both: fused, and a quantized bundle keeps its quantized portable graph too (CUDA, TensorRT providers).")
@click.option("--keep-fp32", is_flag=True,
              help="A quantized bundle keeps its fp32 graphs too (the torch backend); by default it keeps only the "
                   "graphs ONNX Runtime runs.")
@click.option("--lm-head-screen", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="An fp32 model's fused graph (target or draft) gets an exact greedy LM head: an int8 screen, then "
                   "fp32 logits for 256 candidates (docs/gemma3.md). auto: when the vocabulary has >= 32k tokens and "
                   "the head is >= 25% of a step's weights (Gemma 3); sampling and constrained calls use the full head.")
@click.option("--tolerance", default=None, metavar="ATOL,RTOL",
              help="ONNX-vs-PyTorch check per tensor: max|diff| <= ATOL + RTOL * max|ref|  [default: 1e-4,1e-3]")
@click.option("--recycle-prompts", type=click.Path(path_type=Path), default=None,
              help="Prompts (one per line) whose greedy answers seed the successor table of --method recycle "
                   "(default: a built-in set of chat, facts, reasoning and code prompts).")
@click.option("--no-recycle-table", "no_recycle_table", is_flag=True,
              help="Write no successor table (--method recycle then starts from an empty one).")
@click.option("--store", "store_source", type=click.Path(path_type=Path), default=None,
              help="Texts the bundle's datastore holds (`auto`'s source store), as `specrt store --from` reads them: "
                   ".txt, .jsonl, a shard directory or an .npz. `builtin`: the new bundle's own greedy answers to the "
                   "545 prompts shipped with specrt (up to 256 tokens each; ~12 minutes for a 135M model on 2 cores).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@trt_compile_options
@quantize_compile_options
@handle_errors
def compile_cmd(target, draft, medusa, output, max_seq_len, max_draft_tokens, force, ort_graph, keep_fp32,
                lm_head_screen, tolerance, recycle_prompts, no_recycle_table, store_source, as_json, trt_options,
                quant_options):
    """Export target (and draft) to ONNX, validate, and write a bundle (with --engines trt: plus engines)."""
    from specrt.compiler import compile_bundle

    spec = compile_spec(target=target, draft=draft, medusa=medusa, output=output, max_seq_len=max_seq_len,
                        max_draft_tokens=max_draft_tokens, force=force, ort_graph=ort_graph, keep_fp32=keep_fp32,
                        lm_head_screen=lm_head_screen, tolerance=tolerance, trt_options=trt_options,
                        quant_options=quant_options)
    steps = []
    if not no_recycle_table:  # runtime/proposers/recycle_seed.py; a bad prompts file fails before compiling
        from specrt.cli.recycle_step import recycle_seed_step

        steps.append(recycle_seed_step(recycle_prompts))
    elif recycle_prompts is not None:
        raise click.UsageError("--recycle-prompts seeds the table that --no-recycle-table leaves out: give one")
    if store_source is not None:  # a missing file fails here, before compiling
        from specrt.cli.store_step import store_step

        steps.append(store_step(store_source))
    with step_progress(enabled=not as_json) as progress:
        out = compile_bundle(spec, progress=progress, extra_steps=steps)
    from specrt.cli.describe import bundle_summary

    summary = bundle_summary(out)
    if as_json:
        echo_json(summary)
    else:
        from specrt.cli.describe import human_size

        parts = list(summary["models"])
        if summary["medusa"] is not None:
            parts.append(f"{summary['medusa']['num_heads']} Medusa heads")
        if summary["draft_head"] is not None:
            parts.append("draft head")
        click.echo(f"wrote bundle {out} ({', '.join(parts)}; max_seq_len={max_seq_len}, "
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
