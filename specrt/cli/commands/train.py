"""`specrt distill-draft` and `specrt train-medusa`: train drafting for your own target and text."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..main import echo_json, handle_errors, main
from ...core.errors import InvalidArgument


def _recipes():
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise InvalidArgument("training needs transformers: pip install 'specrt[train]'") from None
    from ... import recipes

    return recipes


def _check_inputs(target: Path, data: tuple[Path, ...]) -> None:
    from ...models.checkpoint import open_checkpoint

    open_checkpoint(target)  # a clear error for a missing or unsupported target
    if not data:
        raise InvalidArgument("--data needs at least one text file or directory")
    for p in data:
        if not p.exists():
            raise InvalidArgument(f"--data {p} does not exist")


@main.command("distill-draft")
@click.option("--target", required=True, type=click.Path(path_type=Path), help="Target checkpoint (HF format).")
@click.option("--data", "data", required=True, multiple=True, type=click.Path(path_type=Path),
              help="Text files or directories to train on (repeatable).")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Draft checkpoint directory.")
@click.option("--layers", default=2, show_default=True, type=int)
@click.option("--hidden", default=256, show_default=True, type=int)
@click.option("--intermediate", default=None, type=int, help="MLP width (default: ~2.7 x hidden).")
@click.option("--heads", default=None, type=int, help="Attention heads (default: hidden / 64).")
@click.option("--steps", default=None, type=int, help="Training steps (default: as many as --max-minutes allow).")
@click.option("--max-minutes", default=20.0, show_default=True, type=float)
@click.option("--seq-len", default=256, show_default=True, type=int)
@click.option("--batch-size", default=8, show_default=True, type=int)
@click.option("--lr", default=2e-3, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def distill_draft_cmd(target, data, output, layers, hidden, intermediate, heads, steps, max_minutes, seq_len,
                      batch_size, lr, as_json):
    """Train a small draft for TARGET on your text by distillation (KL to the target's logits); resumable."""
    _check_inputs(target, data)
    if layers < 1 or hidden < 16:
        raise InvalidArgument(f"--layers must be >= 1 and --hidden >= 16, got {layers}, {hidden}")
    _recipes()
    from ...recipes.distill import distill_draft

    metrics = distill_draft(target, list(data), output, layers=layers, hidden=hidden, intermediate=intermediate,
                            heads=heads or max(1, hidden // 64), steps=steps, seq_len=seq_len,
                            batch_size=batch_size, lr=lr, max_minutes=max_minutes, progress=not as_json)
    summary = {"output": str(output), "acceptance": metrics.get("acceptance"),
               "per_token_cost_ratio": metrics.get("per_token_cost_ratio"),
               "draft_heldout": metrics.get("draft_heldout")}
    if as_json:
        echo_json(summary)
    else:
        click.echo(f"wrote draft {output}; held-out greedy acceptance vs target: "
                   f"{json.dumps(metrics.get('acceptance'))}; cost ratio {metrics.get('per_token_cost_ratio'):.3f}")
        click.echo(f"next: specrt compile --target {target} --draft {output} -o artifacts/my-pair")


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
@handle_errors
def train_medusa_cmd(target, data, output, num_heads, steps, max_minutes, seq_len, batch_size, lr):
    """Train Medusa-1 heads on a frozen TARGET (saved in the format `specrt compile --medusa` reads)."""
    _check_inputs(target, data)
    if not 1 <= num_heads <= 16:
        raise InvalidArgument(f"--num-heads must be in [1, 16], got {num_heads}")
    _recipes()
    from ...recipes.medusa_train import train_heads_from_paths

    metrics = train_heads_from_paths(target, list(data), output, num_heads=num_heads, steps=steps,
                                     max_minutes=max_minutes, seq_len=seq_len, batch_size=batch_size, lr=lr)
    click.echo(f"wrote Medusa heads {output}; held-out top-1 accuracy per head: {metrics.get('head_accuracy')}")
    click.echo(f"next: specrt compile --target {target} --medusa {output} -o artifacts/my-medusa")
