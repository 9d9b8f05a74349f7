"""`specrt generate`: its own module, so that a one-token run imports no compile, bench or serve code (the CLI
registers commands lazily: specrt/cli/main.py `COMMAND_MODULES`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specrt.cli.main import KType, echo_json, exit_fast_when_done, handle_errors, main
from specrt.cli.options import BatchSize, backend_option, method_option, prefix_cache_budget, prefix_cache_options


@main.command("generate")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompt", default=None, help="Prompt text (or --chat, or --prompts-file).")
@click.option("--prompts-file", "prompts_file", default=None, type=click.Path(path_type=Path),
              help="Many prompts, decoded together on the batching scheduler: a .jsonl file (a JSON string, or "
                   "{\"prompt\"} / {\"chat\", \"system\"}, per line) or text (one prompt per line); prints one "
                   "JSON line per prompt, in order.")
@click.option("--max-batch", default="auto", show_default=True, type=BatchSize(),
              help="With --prompts-file: requests decoded at once (auto: as specrt serve; 0: one at a time).")
@prefix_cache_options
@click.option("--chat", "chat", default=None, help="A user message, rendered with the bundle's chat template.")
@click.option("--system", default=None, help="A system message for --chat.")
@click.option("--chat-template-kwargs", "template_kwargs", default=None, metavar="JSON",
              help="Chat template variables as a JSON object, e.g. '{\"enable_thinking\": false}' (Qwen3), for --chat "
                   "and --prompts-file's chat lines: the server's chat_template_kwargs.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=None, type=float,
              help="0 = greedy (default: the bundle's generation_config, else 0).")
@click.option("--top-k", default=None, type=int, help="0 = off (default: the bundle's generation_config, else 0).")
@click.option("--top-p", default=None, type=float, help="1 = off (default: the bundle's generation_config, else 1).")
@click.option("--min-p", "min_p", default=None, type=float,
              help="0 = off: drop tokens below min-p x the likeliest one's probability (default: the bundle's "
                   "generation_config, else 0).")
@click.option("--seed", default=None, type=int, help="Makes sampling reproducible.")
@click.option("--presence-penalty", default=None, type=float, help="[-2, 2], over generated tokens (OpenAI).")
@click.option("--frequency-penalty", default=None, type=float, help="[-2, 2], over generated tokens (OpenAI).")
@click.option("--repetition-penalty", default=None, type=float,
              help="(0, 2], over prompt + generated tokens (vLLM); 1 = off.")
@method_option()
@click.option("--num-speculative-tokens", "k", default="auto", show_default=True, type=KType(),
              help="Tokens drafted per step, or 'auto' (adaptive).")
@click.option("--auto-sources", "auto_sources", default=None, metavar="SOURCES",
              help="Method auto's sources, comma-separated of ngram, recycle, draft, head (default: every one the "
                   "bundle has); with a leading '-' each, those left out: --auto-sources=-head.")
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
def generate_cmd(bundle, prompt, prompts_file, max_batch, prefix_cache_mb, no_prefix_cache, chat, system,
                 template_kwargs, max_new_tokens, temperature, top_k, top_p, min_p, seed,
                 presence_penalty, frequency_penalty, repetition_penalty, method, k, auto_sources, ngram_min, ngram_max, backend, target_device, draft_device, threads, stream, strict, as_json,
                 json_schema, json_object, regex, grammar):
    """Generate text from BUNDLE with speculative decoding."""
    from specrt.core.errors import InvalidArgument
    from specrt.core.tokenizer import IncrementalDecoder
    from specrt.cli.generate_output import context_warning, stats_line
    from specrt.runtime import load

    if sum(x is not None for x in (prompt, chat, prompts_file)) != 1:
        raise InvalidArgument("give exactly one of --prompt, --chat and --prompts-file")
    if prompts_file is not None and (system is not None or stream):
        raise InvalidArgument("--system and --stream take one prompt: with --prompts-file, give a system message "
                              "per line ({\"chat\": ..., \"system\": ...}); results print as JSON lines")
    if system is not None and chat is None:
        raise InvalidArgument("--system needs --chat")
    variables = template_variables(template_kwargs, prompt is not None)
    from specrt.cli.constraint_options import constraint_from_options
    from specrt.runtime.request import GenerationRequest

    def request():  # the one request of the command, built after the prompt files and flags are checked
        return GenerationRequest.from_options(
            "generate", max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            min_p=min_p, seed=seed,
            method=method, num_speculative_tokens=k, auto_sources=auto_sources, ngram_min=ngram_min,
            ngram_max=ngram_max, strict=strict,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            repetition_penalty=repetition_penalty,
            constraint=constraint_from_options(json_schema, json_object, regex, grammar))

    if prompts_file is not None:
        return _generate_file(bundle, prompts_file, max_batch, backend, threads, target_device, draft_device, request,
                              prefix_cache_budget(prefix_cache_mb, no_prefix_cache), variables)
    from specrt.runtime.arguments import check_text

    for flag, text in (("--chat", chat), ("--system", system)):
        if text is not None:
            check_text(text, flag)
    req = request()
    with loading_status(bundle):
        gen = load(bundle, backend=backend, threads=threads, target_device=target_device,
                   draft_device=draft_device, warmup=False)  # one call: time the shapes only if it needs them
    if chat is not None:
        from specrt.runtime.chat_template import ChatFormatter, chat_prompt_ids

        formatter = ChatFormatter.from_manifest(gen.manifest)
        if formatter.kind == "plain":
            click.echo("note: the bundle has no chat template: using the plain 'role: content' format", err=True)
        prompt = chat_prompt_ids(gen, chat, system, formatter, variables)
    if stream and not as_json:
        dec, stats = IncrementalDecoder(gen.tokenizer), None
        for chunk, stats in gen.stream_tokens(prompt, request=req):
            sys.stdout.write(dec.push(chunk) or "")
            sys.stdout.flush()
        sys.stdout.write(dec.flush() + "\n")
        sys.stdout.flush()
    else:
        res = gen.generate(prompt, request=req)
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
    exit_fast_when_done()


def template_variables(text: str | None, plain_prompt: bool) -> dict | None:
    """--chat-template-kwargs: a JSON object of template variables (checked as the server checks
    chat_template_kwargs), or None."""
    if text is None:  # nothing imported: a plain --prompt call loads no template engine
        return None
    import json

    from specrt.core.errors import InvalidArgument
    from specrt.runtime.chat_template import check_variables

    if plain_prompt:
        raise InvalidArgument("--chat-template-kwargs needs --chat or --prompts-file (--prompt is not rendered with "
                              "the chat template)")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"--chat-template-kwargs is not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise InvalidArgument("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    try:
        check_variables(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"--chat-template-kwargs: {exc}") from None
    return value


def _generate_file(bundle, prompts_file, max_batch, backend, threads, target_device, draft_device, request,
                   prefix_cache_mb, variables=None):
    """--prompts-file: every prompt on the batching scheduler, one JSON line each (specrt/cli/generate_batch.py).
    `request()` builds the command's one GenerationRequest (after the file is read)."""
    from specrt.cli.generate_batch import read_located, result_line, run_file
    from specrt.cli.generate_output import context_warning
    from specrt.runtime import load

    located = read_located(prompts_file)  # a bad file fails before anything loads
    wheres, prompts = [w for w, _ in located], [p for _, p in located]
    req = request()
    max_new_tokens = req.max_new_tokens
    if backend in ("auto", "ort") and max_batch not in (0, 1):
        from specrt.runtime.backends.ort.threads import share_thread_pool

        share_thread_pool(threads)  # the engine's sessions on one pool, as `specrt serve` (threads.py)
    with loading_status(bundle):
        gen = load(bundle, backend=backend, threads=threads, target_device=target_device, draft_device=draft_device)
    results, seconds, batch = run_file(gen, prompts, max_batch, max_new_tokens, req, wheres, prefix_cache_mb,
                                       variables)
    for i, res in enumerate(results):
        click.echo(result_line(i, res))
    for where, res in zip(wheres, results):
        warning = context_warning(res.stats, max_new_tokens, gen.max_seq_len)
        if warning:
            click.echo(f"{where}: {warning}", err=True)
    tokens = sum(len(r.token_ids) for r in results)
    how = f"batches of up to {batch}" if batch else "one at a time"
    click.echo(f"{len(results)} prompts, {tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tok/s, "
               f"{how})", err=True)
    exit_fast_when_done()


def loading_status(bundle: Path):
    """A transient 'loading BUNDLE...' line on a terminal's stderr (nothing when stderr is a pipe or a file)."""
    import contextlib

    if not sys.stderr.isatty():  # rich (~0.15 s to import) only where the line is shown
        return contextlib.nullcontext()
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        return contextlib.nullcontext()
    return console.status(f"loading {bundle} (checking checksums, creating ONNX Runtime sessions)...")
