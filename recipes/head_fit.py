"""Resumable training of the fused draft head on shards that may still be growing, with a learning curve.

`fit_fused_head` trains fc + the layer with AdamW (constant learning rate after a warm-up: the data grows while it
trains, so there is no total to decay towards) on random windows of the training sequences, with the
training-time-test loss of recipes/head_ttt.py. Every `eval_every` steps it re-opens the shard directory (new
shards join the training set), re-picks the head's vocabulary from all training answers so far (a frozen buffer:
no trained weight depends on it), measures the held-out acceptance and appends one line to `RUN/curve.jsonl`
({step, tokens seen, training tokens available, held-out acceptance per position, teacher-forced top-1, loss}),
then checkpoints `RUN/fit.pt` (the trained state, the optimiser, the step and the vocabulary; also every
`ckpt_minutes` and at the end): a process killed at any time loses at most `ckpt_minutes` of training, and the next
call goes on from there. A measure that beats every earlier one (held-out acceptance per drafted token) also writes
`RUN/best.pt` (the trained state, the vocabulary, its curve line): `best_fused_head` rebuilds that head, which is the
one to ship (later steps may overfit a small data set). On a terminal the progress bar
shows the loss and the last held-out acceptance; elsewhere one line per measure.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specrt.models.base import Decoder
from specrt.models.draft_head_fused import FusedDraftHead
from specrt.recipes.head_shards import default_feature_layers, shard_layers
from specrt.recipes.head_shardset import ShardSet, choose_vocab_from_counts, make_windows
from specrt.recipes.head_train import reduced_index
from specrt.recipes.head_ttt import heldout_acceptance, ttt_loss

BEST = "best.pt"  # the trained state of the best held-out measure


def fit_fused_head(target: Decoder, shard_dir: Path, run_dir: Path, *, steps: int, draft_vocab: int = 8192,
                   batch_size: int = 8, rows: int = 256, lr: float = 3e-3, depths: int = 3,
                   feature_weight: float = 1.0, eval_every: int = 200, eval_sequences: int = 54,
                   min_train_tokens: int = 20_000, seed: int = 0, deadline: float | None = None,
                   ckpt_minutes: float = 5.0,
                   progress: bool = True, say: Callable[[str], None] = print) -> FusedDraftHead:
    """Train until `steps` (a total: steps done in earlier calls count) or `deadline` (time.time()); returns the head."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = ShardSet(shard_dir)
    if data.tokens(data.train) < min_train_tokens:
        raise ValueError(f"{shard_dir} holds {data.tokens(data.train)} training tokens, fewer than {min_train_tokens}")
    eos = set(int(e) for e in target.config.eos_token_ids)
    lm = target.lm_head_weight().detach()
    v = target.config.vocab_size

    def vocab() -> torch.Tensor:
        return choose_vocab_from_counts(data.token_counts(v), draft_vocab, eos)

    ckpt = run_dir / "fit.pt"
    state = torch.load(ckpt, weights_only=False) if ckpt.exists() else None
    layers = tuple(state["feature_layers"]) if state else (shard_layers(shard_dir) or
                                                           default_feature_layers(target.config.num_layers))
    head = FusedDraftHead(target, state["vocab_ids"] if state else vocab(), layers)
    params = head.trained_parameters()
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, seen = 0, 0
    if state:
        head.load_state_dict({**head.state_dict(), **state["trained"]})
        opt.load_state_dict(state["opt"])
        step, seen = state["step"], state["tokens_seen"]
        say(f"resumed at step {step} ({seen} tokens seen)")
    lookup = reduced_index(head.vocab_ids, v)
    ema, last, saved = None, {}, time.time()
    best_path = run_dir / BEST
    best = torch.load(best_path, weights_only=False)["line"].get("heldout_acceptance", -1.0) \
        if best_path.exists() else -1.0

    def save() -> None:
        _save(ckpt, {"trained": head.trained_state(), "opt": opt.state_dict(), "step": step, "tokens_seen": seen,
                     "vocab_ids": head.vocab_ids, "feature_layers": layers})

    def measure() -> dict:
        """New shards joined, the vocabulary re-picked, the held-out measure appended to the curve, a checkpoint
        (and the best one when it beats the earlier measures)."""
        nonlocal lookup, best
        data.refresh()
        head.set_vocab(lm, vocab())
        lookup = reduced_index(head.vocab_ids, v)
        held = [data.sequence(r) for r in data.heldout[:eval_sequences]]
        head.eval()
        got = heldout_acceptance(head, held) if held else {}
        head.train()
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": step, "tokens_seen": seen,
                "train_tokens": data.tokens(data.train), "train_sequences": len(data.train),
                "heldout_sequences": len(held), "loss_ema": None if ema is None else round(ema, 4),
                "train_agree_per_depth": [round(a, 4) for a in agree], **{f"heldout_{k}": x for k, x in got.items()}}
        with open(run_dir / "curve.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        save()
        if got and got["acceptance"] >= best:
            best = got["acceptance"]
            _save(best_path, {"trained": head.trained_state(), "vocab_ids": head.vocab_ids, "feature_layers": layers,
                              "line": line})
        if not bar:
            say(f"step {step}: loss {line['loss_ema']}, held-out per position {got.get('per_position')} "
                f"(tf top-1 {got.get('tf_top1')}), {line['train_tokens']} training tokens")
        return got

    agree: list = []
    measured = step
    bar = _bar(progress, steps, step)
    while step < steps and (deadline is None or time.time() < deadline):
        rng = np.random.default_rng([seed, step])
        picks = [data.train[int(i)] for i in rng.integers(0, len(data.train), size=batch_size)]
        w = make_windows([data.sequence(p) for p in picks], rows, rng, lookup)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 50)
        loss, agree = ttt_loss(head, w, depths, feature_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step, seen = step + 1, seen + int(w["mask"].sum())
        value = float(loss.detach())
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        if bar:
            bar[0].update(bar[1], completed=step, loss=ema, acc=last.get("acceptance", float("nan")))
        if step % eval_every == 0 or step == steps:
            last, measured = measure(), step
            saved = time.time()
        elif time.time() - saved > ckpt_minutes * 60:
            save()
            saved = time.time()
    if measured != step:  # stopped by the deadline between two measures
        measure()
    if bar:
        bar[0].stop()
    save()
    return head.eval()


def best_fused_head(target: Decoder, run_dir: Path) -> tuple[FusedDraftHead, dict]:
    """(the head of the best held-out measure so far, in eval mode; its curve line) from `RUN/best.pt`."""
    state = torch.load(Path(run_dir) / BEST, weights_only=False)
    head = FusedDraftHead(target, state["vocab_ids"], tuple(state["feature_layers"]))
    head.load_state_dict({**head.state_dict(), **state["trained"]})
    return head.eval(), state["line"]


def _bar(progress: bool, total: int, done: int):
    import sys

    if not (progress and sys.stderr.isatty()):
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("[bold]train-head"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.3f}  held-out acceptance {task.fields[acc]:.3f}"),
                   TimeRemainingColumn())
    bar.start()
    return bar, bar.add_task("train", total=total, completed=done, loss=float("nan"), acc=float("nan"))


def _save(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
