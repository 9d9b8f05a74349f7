"""`train_heads_from_paths`: Medusa heads for any target on the user's text files (`specrt train-medusa`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specrt.recipes.common import pick_device
from specrt.recipes.corpus import read_text_files
from specrt.recipes.evaluate import medusa_accuracy
from specrt.recipes.medusa import save_medusa, train_medusa
from specrt.recipes.tokenizer import encode_documents, hf_encoder


def train_heads_from_paths(target_dir, data_paths, out_dir, *, num_heads: int = 3, steps: int | None = None,
                           max_minutes: float | None = 10.0, seq_len: int = 256, batch_size: int = 8,
                           lr: float = 1e-3, run_dir=None, progress: bool = True, force: bool = False) -> dict:
    """Tokenize `data_paths` with the target's tokenizer, train heads (resumable in `run_dir`, default
    `<out_dir>_run`), hold out the last 5% of tokens, save the heads to `out_dir`, return metrics.
    `out_dir` and the run directory follow the recipes' output rule (recipes/outputs.py; `force` replaces old heads
    only; the run directory's checkpoint is refused when made for another target, data or number of heads)."""
    from specrt.compiler.output_dir import MEDUSA_HEADS
    from specrt.recipes.outputs import path_digest, recipe_output

    data_paths = list(data_paths)
    inputs = (Path(target_dir), *map(Path, data_paths))
    made_for = {"recipe": "train-medusa", "target": path_digest(target_dir),
                "data": [path_digest(p) for p in data_paths], "num_heads": num_heads}
    with recipe_output(out_dir, force, inputs, MEDUSA_HEADS, run_dir, made_for) as (staging, run):
        return _train(target_dir, data_paths, staging, run, num_heads=num_heads, steps=steps,
                      max_minutes=max_minutes, seq_len=seq_len, batch_size=batch_size, lr=lr, progress=progress)


def _train(target_dir, data_paths, out: Path, run: Path, *, num_heads, steps, max_minutes, seq_len, batch_size, lr,
           progress) -> dict:
    dev = pick_device()
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(dev).eval()
    eos = target.config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else (eos if eos is not None else 0)
    tokens = encode_documents(hf_encoder(tok), read_text_files(list(data_paths)), int(eos))
    cut = int(len(tokens) * 0.95)
    train, heldout = tokens[:cut], tokens[cut:]
    seq_len = min(seq_len, max(8, len(train) // 2 - 2))
    if len(train) <= seq_len + num_heads + 2:
        raise ValueError(f"only {len(train)} training tokens: give more text")
    heads, stats = train_medusa(target, train, run, num_heads=num_heads, steps=steps, max_minutes=max_minutes,
                                seq_len=seq_len, batch_size=batch_size, lr=lr, progress=progress)
    save_medusa(heads.cpu(), out, target.config.vocab_size)
    heads.to(dev)
    metrics = {"train": {k: v for k, v in stats.items() if k != "loss_curve"}}
    if len(heldout) > seq_len + num_heads + 2:
        acc = medusa_accuracy(target, heads, heldout, seq_len=seq_len, max_windows=8)
        metrics["head_accuracy"] = acc
    (run / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str) + "\n")
    return metrics
