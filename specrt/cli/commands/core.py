"""`specrt compile`, `specrt generate`, `specrt inspect`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..main import KType, echo_json, handle_errors, main
from ...compiler.quantize_cli import prepare_quantization, quantize_compile_options
from ...compiler.trt.cli import prepare_trt_compile, trt_compile_options
from ..progress import step_progress


@main.command("compile")
@click.option("--target", required=True, type=click.Path(path_type=Path), help="Target checkpoint directory (Hugging Face format).")
@click.option("--draft", type=click.Path(path_type=Path),
              help="Draft checkpoint directory (same tokenizer as the target), or self:int4 / self:int8 (the "
                   "quantized target as the draft).")
@click.option("--medusa", type=click.Path(path_type=Path), help="Medusa heads directory (see `specrt train-medusa`).")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path), help="Bundle directory to write.")
@click.option("--max-seq-len", default=2048, show_default=True, type=int, help="Context length (prompt + generated).")
@click.option("--max-draft-tokens", default=8, show_default=True, type=int, help="Largest k the bundle accepts.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@trt_compile_options
@quantize_compile_options
@handle_errors
def compile_cmd(target, draft, medusa, output, max_seq_len, max_draft_tokens, force, as_json, trt_options,
                quant_options):
    """Export target (and draft) to ONNX, validate, and write a bundle (with --backend trt: plus engines)."""
    from ...compiler import compile_bundle
    from ...compiler.pipeline import check_compile_args

    check_compile_args(max_seq_len, max_draft_tokens, output, force)
    plan, draft = prepare_quantization(quant_options, draft, trt_backend=trt_options.get("backend") == "trt")
    extra = []
    if medusa is not None:
        from ...compiler.medusa import medusa_step

        extra.append(medusa_step(medusa, target))
    extra += prepare_trt_compile(trt_options, target=target, draft=draft, output=output,
                                 max_seq_len=max_seq_len, max_draft_tokens=max_draft_tokens)
    with step_progress(enabled=not as_json) as progress:
        out = compile_bundle(target, output, draft, max_seq_len=max_seq_len, max_draft_tokens=max_draft_tokens,
                             force=force, progress=progress, extra_steps=extra, quantization=plan)
    from ..describe import bundle_summary

    summary = bundle_summary(out)
    if as_json:
        echo_json(summary)
    else:
        click.echo(f"wrote bundle {out} ({', '.join(summary['models'])}; max_seq_len={max_seq_len}, "
                   f"max_draft_tokens={max_draft_tokens})")


@main.command("generate")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompt", required=True, help="Prompt text.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=int, help="0 = off.")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="1 = off.")
@click.option("--seed", default=None, type=int, help="Makes sampling reproducible.")
@click.option("--method", type=click.Choice(["draft", "ngram", "medusa", "none"]), default=None,
              help="Drafting method (default: draft when the bundle has one, else ngram).")
@click.option("--num-speculative-tokens", "k", default="auto", show_default=True, type=KType(),
              help="Tokens drafted per step, or 'auto' (adaptive).")
@click.option("--ngram-min", default=None, type=int, help="Shortest suffix n-gram to match (ngram method).")
@click.option("--ngram-max", default=None, type=int, help="Longest suffix n-gram to match (ngram method).")
@click.option("--backend", default="auto", show_default=True,
              type=click.Choice(["auto", "ort", "torch", "trt", "ort-cuda", "ort-trt"]))
@click.option("--target-device", default=None, help="e.g. cpu, cuda:0")
@click.option("--draft-device", default=None, help="e.g. cpu, cuda:1")
@click.option("--threads", default=None, type=int, help="CPU threads per model (default: all cores).")
@click.option("--stream", is_flag=True, help="Print text as it is generated.")
@click.option("--json", "as_json", is_flag=True, help='Print {"text", "token_ids", "stats"} as JSON.')
@handle_errors
def generate_cmd(bundle, prompt, max_new_tokens, temperature, top_k, top_p, seed, method, k, ngram_min,
                 ngram_max, backend, target_device, draft_device, threads, stream, as_json):
    """Generate text from BUNDLE with speculative decoding."""
    from ...runtime import load

    gen = load(bundle, backend=backend, threads=threads, target_device=target_device, draft_device=draft_device)
    kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, method=method,
                  num_speculative_tokens=k, ngram_min=ngram_min, ngram_max=ngram_max)
    if stream and not as_json:
        for piece in gen.stream(prompt, max_new_tokens, **kwargs):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        return
    res = gen.generate(prompt, max_new_tokens, **kwargs)
    if as_json:
        echo_json({"text": res.text, "token_ids": res.token_ids, "stats": res.stats.to_dict()})
        return
    click.echo(res.text)
    s = res.stats
    click.echo(f"[{s.method}, k={s.num_speculative_tokens}, {s.new_tokens} tokens, "
               f"{s.tokens_per_second:.1f} tok/s, acceptance {s.acceptance_rate:.2f}, "
               f"mean accepted {s.mean_accepted_tokens:.2f}, backend {s.backend}]", err=True)


@main.command("inspect")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--memory", is_flag=True, help="Print the memory plan per model and device.")
@click.option("--max-seq-len", default=None, type=int, help="Context length for the memory plan.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def inspect_cmd(bundle, memory, max_seq_len, as_json):
    """Describe a bundle: models, graph I/O, profiles, engines, checksums."""
    from ..describe import bundle_summary, print_summary

    summary = bundle_summary(bundle, memory=memory, max_seq_len=max_seq_len)
    if as_json:
        echo_json(summary)
    else:
        print_summary(summary)
