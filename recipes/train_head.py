"""`train_head_for_target` (`specrt train-head`): a draft head for a target, from the target's own answers.

Steps, all in a run directory (default `<output>_run`, resumable): the target (a GGUF converted once), its
answers to the prompt set with features and top-K logits (recipes/head_data.py, cached), the head's vocabulary
(the `draft_vocab` most frequent tokens of the training answers), training (recipes/head_train.py, resumable),
held-out acceptance per draft position on prompts never trained on (every tenth prompt). The output and the run
directory follow the recipes' output rule (recipes/outputs.py: never an input, `force` replaces only a head
directory, the run directory's caches are refused when made for another target or other options); `max_minutes`
covers the whole command (recipes/budget.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch

from specrt.core.errors import InvalidArgument
from specrt.models.checkpoint import open_checkpoint
from specrt.models.draft_head import DraftHead, save_head
from specrt.recipes.budget import Budget
from specrt.recipes.head_data import (answers_from_bundle, build_dataset, chat_encoder, dataset_from_answers,
                                       default_prompts_path, read_prompts)
from specrt.recipes.head_train import acceptance_per_position, choose_vocab, train_head
from specrt.recipes.outputs import DRAFT_HEAD, check_recipe_output, path_digest, recipe_output

HELDOUT_EVERY = 10  # prompt i is held out when i % 10 == 9
GENERATION_SHARE = 0.6  # of --max-minutes, at most, for making the data
# With --answers-bundle the features come from one PyTorch pass after the answers, which takes ~0.6x the answers'
# time (SmolLM2-135M, 2 cores: 1,635 answers in 626 s at 32 a time, their features in 389 s): the answers get 35% of
# the budget, so that the data takes ~55% and training the rest.
BUNDLE_ANSWERS_SHARE = 0.35
# Answers are generated on one thread: one-token steps have little parallel work, and on a shared CPU a second
# thread made them far slower (measured on 2 loaded cores: tiny model 30x, SmolLM2-135M 1.8 s vs 18 s a token).


def check_options(draft_vocab: int, answer_tokens: int, samples: int, steps: int | None,
                  max_minutes: float | None) -> None:
    """The numeric options, with the bad value in the message (the CLI checks its own ones the same way)."""
    for name, value, low in (("--draft-vocab", draft_vocab, 2), ("--answer-tokens", answer_tokens, 2),
                             ("--samples", samples, 0)):
        if value < low:
            raise InvalidArgument(f"{name} must be >= {low}, got {value}")
    if steps is not None and steps < 1:
        raise InvalidArgument(f"--steps must be >= 1, got {steps} (a head trained for no step is the untrained one)")
    if max_minutes is not None and not max_minutes > 0:
        raise InvalidArgument(f"--max-minutes must be > 0, got {max_minutes}")
    if steps is None and max_minutes is None:
        raise InvalidArgument("give --steps or a positive --max-minutes")


def output_inputs(target: Path, prompts: Path | None, answers_bundle: Path | None) -> tuple[Path, ...]:
    """What `-o` and the run directory may not overlap (recipes/outputs.py)."""
    return tuple(Path(p) for p in (target, prompts, answers_bundle) if p is not None)


def _target_dir(target: Path, run: Path) -> Path:
    from specrt.models.gguf_source import is_gguf_source, prepare_gguf

    if not is_gguf_source(target):
        return target
    done = run / "target" / "checkpoint"
    if not (done / "config.json").exists():
        shutil.rmtree(run / "target", ignore_errors=True)
        prepare_gguf(target, run / "target")
    return done


def heldout_prompts(n: int) -> set[int]:
    """Prompts never trained on: every tenth (the last one when there are fewer than ten)."""
    held = {i for i in range(n) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1}
    return held or {n - 1}


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def train_head_for_target(target: str | Path, out: str | Path, *, prompts: str | Path | None = None,
                          draft_vocab: int = 8192, answer_tokens: int = 128, samples: int = 1,
                          steps: int | None = None, max_minutes: float | None = 30.0, batch_size: int = 8,
                          max_rows: int = 256, lr: float = 6e-3, seed: int = 0, run_dir: str | Path | None = None,
                          force: bool = False, progress: bool = True,
                          answers_bundle: str | Path | None = None, answer_batch: int = 32) -> dict:
    """Train a head for `target` into `out` (see the module docstring); returns the metrics (also metrics.json).
    `answers_bundle`: a bundle compiled from the same target makes the answers (batched, on ONNX Runtime)."""
    started = time.time()
    target, out = Path(target), Path(out)
    check_options(draft_vocab, answer_tokens, samples, steps, max_minutes)
    inputs = output_inputs(target, Path(prompts) if prompts else None, Path(answers_bundle) if answers_bundle else None)
    check_recipe_output(out, force, inputs, DRAFT_HEAD, run_dir)  # before anything is read or loaded
    texts = read_prompts(Path(prompts) if prompts else None)
    if len(texts) < 2:
        raise InvalidArgument("the prompt set needs at least 2 prompts (one is held out)")
    made_for = {"recipe": "train-head", "target": path_digest(target),
                "prompts": path_digest(Path(prompts) if prompts else default_prompts_path()),
                "answer_tokens": answer_tokens, "samples": samples, "seed": seed,
                "answers": "bundle" if answers_bundle else "pytorch decoder"}
    budget = Budget(started, max_minutes, steps is None)
    with recipe_output(out, force, inputs, DRAFT_HEAD, run_dir, made_for) as (staging, run):
        metrics = _train_into(staging, run, target, texts, budget, prompts=prompts, draft_vocab=draft_vocab,
                              answer_tokens=answer_tokens, samples=samples, steps=steps, batch_size=batch_size,
                              max_rows=max_rows, lr=lr, seed=seed, progress=progress, answers_bundle=answers_bundle,
                              answer_batch=answer_batch)
    (run / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str) + "\n")
    return metrics


def _train_into(staging: Path, run: Path, target: Path, texts: list[str], budget: "Budget", *, prompts, draft_vocab,
                answer_tokens, samples, steps, batch_size, max_rows, lr, seed, progress, answers_bundle,
                answer_batch) -> dict:
    """train_head_for_target's body: data, vocabulary, training, held-out measure; the head saved into `staging`."""
    torch.manual_seed(seed)
    tdir = _target_dir(target, run)
    ck = open_checkpoint(tdir)
    decoder = ck.load_decoder(torch.float32).eval().requires_grad_(False)
    eos = set(int(e) for e in ck.config.eos_token_ids)
    say = lambda text: _say(progress, f"[train-head] {text} ({budget.elapsed():.0f}s)")  # noqa: E731
    loaded_s = budget.elapsed()  # converting (a GGUF, once per run directory) and loading the target
    if answers_bundle is not None:
        answers = answers_from_bundle(Path(answers_bundle), ck.config, chat_encoder(tdir), texts, run,
                                      max_new=answer_tokens, samples=samples, seed=seed, max_batch=answer_batch,
                                      progress=lambda d, t: say(f"target answers: prompts {d}/{t}"),
                                      deadline=budget.data_deadline(BUNDLE_ANSWERS_SHARE))
        seqs = dataset_from_answers(decoder, answers, run, deadline=budget.data_deadline(GENERATION_SHARE))
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one-token steps: a thread pool costs more than it gives (measured above)
        try:
            seqs = build_dataset(decoder, chat_encoder(tdir), texts, run, max_new=answer_tokens, samples=samples,
                                 eos=eos, seed=seed, deadline=budget.data_deadline(GENERATION_SHARE),
                                 progress=lambda d, t: (d % 10 == 0 or d == t) and say(f"target answers {d}/{t}"))
        finally:
            torch.set_num_threads(threads)
    wanted = len(texts) * (1 + samples)
    if not seqs:
        raise InvalidArgument(f"no training answers were made within --max-minutes {budget.minutes:g}: converting and "
                              f"loading the target took {loaded_s:.0f} s of the data's {GENERATION_SHARE:.0%} share "
                              f"(the converted target is kept in {run}); give more --max-minutes")
    if len(seqs) < wanted or any(s.get("cut") for s in seqs):
        say(f"data making stopped at its share of --max-minutes: {len(seqs)} of {wanted} answers made "
            f"({sum(bool(s.get('cut')) for s in seqs)} cut short); training on those")
    held = heldout_prompts(len(texts))
    heldout = [s for s in seqs if s["prompt"] in held]
    train = [s for s in seqs if s["prompt"] not in held]
    if not train:
        raise InvalidArgument("no training answers were made (only held-out ones): give more --max-minutes")
    vocab = choose_vocab(train, ck.config.vocab_size, draft_vocab, eos)
    head = DraftHead(decoder, vocab)
    del decoder
    left = budget.training_minutes()
    say(f"{len(train)} training answers ({sum(s['ids'].numel() for s in train)} tokens), {len(heldout)} held out; "
        f"vocabulary {vocab.numel()} tokens; training for {'%d steps' % steps if steps else '%.1f minutes' % left}")
    stats = train_head(head, train, run, steps=steps, max_minutes=left, batch_size=batch_size, max_rows=max_rows,
                       lr=lr, seed=seed, progress=progress)
    head.eval()
    acc = acceptance_per_position(head, heldout, deadline=budget.end)
    coverage = _coverage(heldout, vocab)
    metrics = {"target": str(target), "draft_vocab_size": int(vocab.numel()), "heldout_vocab_coverage": coverage,
               "train_answers": len(train), "heldout_answers": len(heldout),
               "train_tokens": int(sum(s["ids"].numel() for s in train)), "heldout_acceptance": acc,
               "train": {k: v for k, v in stats.items() if k != "loss_curve"},
               "data_complete": len(seqs) == wanted and not any(s.get("cut") for s in seqs),
               "wall_s": round(budget.elapsed(), 1),
               "settings": {"answer_tokens": answer_tokens, "samples": samples, "batch_size": batch_size,
                            "max_rows": max_rows, "lr": lr, "seed": seed, "prompts": str(prompts or "builtin"),
                            "max_minutes": budget.minutes,
                            "answers": str(answers_bundle) if answers_bundle else "pytorch decoder"}}
    save_head(head, staging, extra={"training": {"heldout_acceptance": acc, "draft_vocab_size": int(vocab.numel())}})
    (staging / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str) + "\n")
    (staging / "README.md").write_text(model_card(metrics, head))
    return metrics


def _coverage(seqs: list[dict], vocab: torch.Tensor) -> float:
    """Share of held-out answer tokens inside the head's vocabulary."""
    keep = set(vocab.tolist())
    toks = [int(t) for s in seqs for t in s["ids"][s["prompt_len"]:].tolist()]
    return round(sum(t in keep for t in toks) / max(len(toks), 1), 4)


def model_card(m: dict, head: DraftHead) -> str:
    a = m["heldout_acceptance"]
    trained = sum(p.numel() for p in head.trained_parameters())
    rows = "\n".join(f"| {i + 1} | {r:.3f} |" for i, r in enumerate(a["per_position"]))
    return f"""# Draft head for {Path(m['target']).name}

An EAGLE-style draft head (fc + one decoder layer initialised from the target's last layer, the target's final
norm, and the target's own output-embedding rows of the {m['draft_vocab_size']} most frequent tokens of the
training answers), trained by `specrt train-head` on the target's own answers. Use it with
`specrt compile --target TARGET --draft head:THIS_DIR -o BUNDLE`, then `--method head` or `hybrid`.

- trained parameters: {trained:,} (fc and the layer); the rest is rebuilt from the target at compile
- training data: {m['train_answers']} answers ({m['train_tokens']} tokens) to the prompt set
  ({m['settings']['prompts']}), greedy + {m['settings']['samples']} sampled per prompt
- training: {m['train'].get('steps_done')} steps, {m['train'].get('wall_s', 0):.0f} s; whole run {m['wall_s']:.0f} s
- held-out vocabulary coverage of answer tokens: {m['heldout_vocab_coverage']:.3f}

## Held-out greedy acceptance ({a['positions']} positions of {m['heldout_answers']} answers to prompts never
trained on; k = {a['k']})

| draft position i | P(drafts 1..i all accepted) |
|---|---|
{rows}

Mean accepted drafts per step: {a['mean_accepted']:.3f} (per drafted token: {a['acceptance']:.3f}).
"""
