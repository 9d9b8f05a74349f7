"""`train_fused_head_for_target` (`specrt train-head --recipe fused`): the EAGLE-3-style head, at scale, resumably.

Steps, all in the run directory (default `<output>_run`): the target (a GGUF converted once); the requests (the
prompt set in every style of recipes/head_shards.STYLES, Spec-Bench's questions refused, every tenth prompt held
out); shards of the target's answers with the features of three layers + the final one and the top-K logits, made
in one pass by the PyTorch decoder (recipes/head_onepass.py), or with `answers_bundle` by that bundle's batch engine
and a teacher-forced pass (the same shards, ~1.8x the CPU) (`RUN/shards`, resumed by shard); training with training-time test and the
top-K distribution loss (`RUN/fit`: checkpoint, learning curve `curve.jsonl`). Run the same command again to go on:
the shards made are kept, and training continues from its checkpoint (`--steps` is the total).

The head directory it writes holds the head of the best held-out measure (RUN/fit/best.pt): a fused head
(head_config.json version 2, `feature_layers`), with its model card (recipes/head_export.py: the learning curve).
`specrt compile --draft head:DIR` makes the target graphs output those layers (docs/draft-head.md, "The fused head").
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from specrt.core.errors import InvalidArgument
from specrt.models.checkpoint import open_checkpoint
from specrt.models.draft_head_fused import save_fused_head
from specrt.recipes.budget import Budget
from specrt.recipes.head_data import chat_encoder, default_prompts_path, read_prompts
from specrt.recipes.head_export import fused_head_card, read_curve
from specrt.recipes.head_fit import BEST, best_fused_head, fit_fused_head
from specrt.recipes.head_shards import make_shards, requests_of
from specrt.recipes.outputs import DRAFT_HEAD, check_recipe_output, path_digest, recipe_output
from specrt.recipes.train_head import _target_dir, check_options, output_inputs

DATA_SHARE = 0.5  # of --max-minutes for making shards (the rest trains on what there is)


def train_fused_head_for_target(target: str | Path, out: str | Path, *, answers_bundle: str | Path | None = None,
                                prompts: str | Path | None = None, draft_vocab: int = 8192, answer_tokens: int = 192,
                                samples: int = 2, steps: int | None = None, max_minutes: float | None = 30.0,
                                batch_size: int = 8, max_rows: int = 256, lr: float = 3e-3, ttt_depth: int = 3,
                                seed: int = 0, run_dir: str | Path | None = None, force: bool = False,
                                progress: bool = True, answer_batch: int = 16, eval_every: int = 100) -> dict:
    """Train a fused head for `target` into `out` (module docstring); returns the metrics (also metrics.json)."""
    started = time.time()
    target, out = Path(target), Path(out)
    bundle = Path(answers_bundle) if answers_bundle is not None else None
    check_options(draft_vocab, answer_tokens, samples, steps, max_minutes)
    if not 1 <= ttt_depth <= 8:
        raise InvalidArgument(f"--ttt-depth must be in [1, 8], got {ttt_depth}")
    inputs = output_inputs(target, Path(prompts) if prompts else None, bundle)
    check_recipe_output(out, force, inputs, DRAFT_HEAD, run_dir)
    requests = requests_of(read_prompts(Path(prompts) if prompts else None))
    made_for = {"recipe": "train-head fused", "target": path_digest(target),
                "prompts": path_digest(Path(prompts) if prompts else default_prompts_path()),
                "answer_tokens": answer_tokens, "samples": samples, "seed": seed, "answers": "target"}
    budget = Budget(started, max_minutes, steps is None)
    say = (lambda text: print(f"[train-head] {text} ({budget.elapsed():.0f}s)", flush=True)) if progress \
        else (lambda _: None)
    with recipe_output(out, force, inputs, DRAFT_HEAD, run_dir, made_for) as (staging, run):
        torch.manual_seed(seed)
        tdir = _target_dir(target, run)
        decoder = open_checkpoint(tdir).load_decoder(torch.float32).eval().requires_grad_(False)
        shards = make_shards(bundle, decoder, chat_encoder(tdir), requests, run / "shards", max_new=answer_tokens,
                             samples=samples, seed=seed, batch=answer_batch, say=say,
                             deadline=budget.data_deadline(DATA_SHARE), maker="engine" if bundle else "onepass")
        say(f"{shards} shards of answers; training")
        try:
            head = fit_fused_head(decoder, run / "shards", run / "fit", steps=steps or 10**9, draft_vocab=draft_vocab,
                                  batch_size=batch_size, rows=max_rows, lr=lr, depths=ttt_depth, seed=seed,
                                  eval_every=eval_every, min_train_tokens=2 * max_rows, deadline=budget.end,
                                  progress=progress, say=say)
        except ValueError as exc:
            raise InvalidArgument(f"{exc}: give more --max-minutes (the shards made are kept in {run})") from None
        curve = read_curve(run / "fit")
        last = curve[-1] if curve else {}
        if (run / "fit" / BEST).exists():  # the head of the best held-out measure, not necessarily the last steps'
            head, last = best_fused_head(decoder, run / "fit")
        metrics = {"target": str(target), "recipe": "fused", "feature_layers": list(head.feature_layers),
                   "draft_vocab_size": head.draft_vocab_size, "ttt_depth": ttt_depth, "shards": shards,
                   "steps": last.get("step"), "train_tokens": last.get("train_tokens"),
                   "heldout_acceptance": {k[len("heldout_"):]: v for k, v in last.items() if k.startswith("heldout_")},
                   "wall_s": round(budget.elapsed(), 1)}
        save_fused_head(head, staging, extra={"training": metrics})
        (staging / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        (staging / "README.md").write_text(fused_head_card(metrics, curve))
    return metrics

