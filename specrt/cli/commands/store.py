"""`specrt store`: add (or replace) a datastore of the target's own text in a bundle, `auto`'s source `store`
(runtime/proposers/store.py; reading the source: store_sources.py; writing: store_write.py)."""

from __future__ import annotations

from pathlib import Path

import click

from specrt.cli.main import echo_json, handle_errors, main
from specrt.core.errors import InvalidArgument

ANSWER_TOKENS = 128


@main.command("store")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--from", "source", type=click.Path(path_type=Path),
              help="Texts to store: a .txt (one text per line), a .jsonl (strings, {\"text\"}, or OpenAI-style "
                   "{\"messages\"}: the assistant turns), a directory of answer shards, or a datastore .npz.")
@click.option("--answers", "answers", type=click.Path(path_type=Path),
              help="Prompts (as --prompts-file of `generate`, each rendered as a chat message) whose greedy answers by "
                   "the bundle itself are stored: the text the datastore drafts best from. `builtin`: the 545 varied "
                   "prompts shipped with specrt (explanations, lists, letters, code, arithmetic, rewriting).")
@click.option("--max-new-tokens", default=ANSWER_TOKENS, show_default=True, type=int,
              help="Longest answer generated for --answers.")
@click.option("--exclude", type=click.Path(path_type=Path), multiple=True,
              help="A .jsonl of questions (Spec-Bench's {\"turns\"}, {\"prompt\"} or strings): samples whose prompt or "
                   "text holds the start of one are left out, so a benchmark on them measures no stored answers. "
                   "Repeatable.")
@click.option("--threads", default=None, type=int, help="CPU threads per model for --answers (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def store_cmd(bundle, source, answers, max_new_tokens, exclude, threads, as_json):
    """Add a datastore of the target's own text to BUNDLE (replacing any): `--method auto` then drafts from it.
    Nothing in BUNDLE changes unless the whole datastore is written."""
    from specrt.runtime import load
    from specrt.runtime.proposers.store_sources import (answer_prompts, build_store, builtin_prompts, is_builtin,
                                                        read_source)
    from specrt.runtime.proposers.store_write import add_to_bundle

    if source is None and answers is None:
        raise InvalidArgument("give --from SOURCE, --answers PROMPTS_FILE, or both")
    if max_new_tokens < 1:
        raise InvalidArgument(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    builtin = is_builtin(answers)
    for name, path in (("--from", source), ("--answers", None if builtin else answers),
                       *(("--exclude", e) for e in exclude)):
        if path is not None and not path.exists():
            raise InvalidArgument(f"{name} {path}: no such file or directory")
    seqs, notes = [], []
    with load(bundle, backend="ort", threads=threads, warmup=False) as gen:
        if answers is not None:
            from specrt.cli.generate_batch import read_prompts

            got, note = answer_prompts(gen, builtin_prompts() if builtin else read_prompts(answers), max_new_tokens,
                                       exclude, skip_long=builtin)
            seqs, notes = seqs + got, notes + [note]
        if source is not None:
            got, note = read_source(gen, source, exclude)
            seqs, notes = seqs + got, notes + [note]
        store = build_store(gen, seqs, str(source or answers))
    add_to_bundle(bundle, store)
    summary = {"bundle": str(bundle), "sources": notes, "tokens": int((store.corpus >= 0).sum()),
               "sequences": len(seqs), "bytes_on_disk": int(store.corpus.nbytes + store.order.nbytes),
               "bytes_in_memory": store.nbytes}
    if as_json:
        echo_json(summary)
        return
    click.echo(f"stored {summary['tokens']} tokens ({'; '.join(notes)}) in {bundle}/store: "
               f"{store.nbytes / 2**20:.1f} MiB in memory; `--method auto` drafts from it")
