"""Train the demo target model (a small ``LlamaForCausalLM``) from scratch.

Usage::

    python -m specrt.recipes.train_target --run-dir /work/train_runs/demo --max-minutes 30

Re-running the same command resumes from ``<run-dir>/target/ckpt.pt``.  When
training finishes, the fp32 model is saved (HF format, with tokenizer files) in
``<run-dir>/target/final`` and the training metrics in ``train_metrics.json``.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from specrt.recipes.common import autocast, pick_device, sample_batch, set_seed, train_loop


def target_config(vocab_size: int = 4096, hidden: int = 384, layers: int = 9, heads: int = 6,
                  kv_heads: int = 2, intermediate: int = 1024, max_positions: int = 1024,
                  eos_id: int = 0) -> LlamaConfig:
    """The demo target architecture (GQA Llama with tied embeddings)."""
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       intermediate_size=intermediate, tie_word_embeddings=True,
                       rope_theta=10000.0, max_position_embeddings=max_positions,
                       eos_token_id=eos_id, bos_token_id=None, pad_token_id=None)



def save_hf(model, out_dir: Path, tokenizer_dir: Path | None, eos_id: int,
            dtype: torch.dtype | None = None) -> None:
    """Save a causal LM in HF format (safetensors) with tokenizer files and a
    ``generation_config.json`` carrying the EOS id.  ``dtype`` converts a copy."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if dtype is not None:
        import copy
        model = copy.deepcopy(model).to(dtype)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id,
                                               bos_token_id=None)
    model.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer_dir is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                     "vocab.json", "merges.txt", "tokenizer.model"):
            if (Path(tokenizer_dir) / name).exists():
                shutil.copy(Path(tokenizer_dir) / name, out_dir / name)


def train_target(tokens: np.ndarray, run_dir: str | Path, tokenizer_dir: Path | None = None, *,
                 config: LlamaConfig | None = None, steps: int | None = None,
                 max_minutes: float | None = 30.0, seq_len: int = 512, batch_size: int = 8,
                 lr: float = 2e-3, warmup: int = 50, seed: int = 0, progress: bool = True) -> dict:
    """Train a target LM on a flat token stream; resumable via ``run_dir/ckpt.pt``.

    Returns training metrics; the final model is saved to ``run_dir/final``.
    """
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    device = pick_device()
    set_seed(seed)
    config = config or target_config()
    model = LlamaForCausalLM(config).to(device)
    model.train()

    def loss_fn(step: int) -> torch.Tensor:
        x = sample_batch(tokens, batch_size, seq_len + 1, step, seed, device)
        with autocast(device):
            logits = model(input_ids=x[:, :-1]).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))

    stats = train_loop(model, list(model.parameters()), loss_fn, ckpt_path=run / "ckpt.pt",
                       steps=steps, tokens_per_step=batch_size * seq_len, lr=lr, warmup=warmup,
                       max_minutes=max_minutes, progress=progress, desc="target")
    model.eval()
    save_hf(model.cpu(), run / "final", tokenizer_dir, config.eos_token_id)
    stats.update(params=sum(p.numel() for p in model.parameters()), seq_len=seq_len,
                 batch_size=batch_size, lr=lr, device=str(device))
    (run / "train_metrics.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def main(argv=None) -> None:
    from specrt.recipes.tokenizer import prepare_stdlib_tokens

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--max-minutes", type=float, default=30.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    a = ap.parse_args(argv)
    data = prepare_stdlib_tokens(a.run_dir)
    stats = train_target(data["train"], Path(a.run_dir) / "target", data["tokenizer_dir"],
                         steps=a.steps, max_minutes=a.max_minutes, seq_len=a.seq_len,
                         batch_size=a.batch_size, lr=a.lr)
    print(json.dumps({k: v for k, v in stats.items() if k != "loss_curve"}, indent=1))


if __name__ == "__main__":
    main()
