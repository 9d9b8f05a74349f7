"""Distil a small Llama draft model from any Hugging Face causal-LM target.

The draft shares the target's vocabulary (``vocab_size`` of the target's output
layer) and tokenizer files.  The loss is KL(p_target || p_draft) at temperature 1
on the target's logits; the target is frozen (eval mode, no grad, bf16 autocast).
Training resumes from ``<run_dir>/ckpt.pt``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specrt.core.errors import InvalidArgument
from specrt.recipes.common import autocast, pick_device, sample_batch, set_seed, train_loop
from specrt.recipes.corpus import read_text_files
from specrt.recipes.evaluate import greedy_acceptance, perplexity
from specrt.recipes.tokenizer import encode_documents, hf_encoder
from specrt.recipes.train_target import save_hf


def per_token_params(model) -> int:
    """Parameters touched per generated token: all unique parameters except the
    input embedding table, plus the output projection (counted even when tied)."""
    uniq = {id(p): p for p in model.parameters()}
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    n = sum(p.numel() for p in uniq.values()) - emb.numel()
    return n + (out.numel() if out is emb else 0)


def _eos_id(tokenizer, config) -> int:
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0]
    if eos is None:
        raise ValueError("the target has no EOS token id")
    return int(eos)


def draft_config(target, eos_id: int, *, layers: int, hidden: int, intermediate: int | None,
                 heads: int | None, kv_heads: int) -> LlamaConfig:
    """A Llama config for the draft with the target's vocabulary and context length."""
    tc = target.config
    heads = heads or max(1, hidden // 64)
    intermediate = intermediate or 64 * round(hidden * 8 / 3 / 64)
    max_pos = getattr(tc, "max_position_embeddings", None) or getattr(tc, "n_positions", None) or 2048
    theta = (getattr(tc, "rope_parameters", None) or {}).get("rope_theta") if isinstance(
        getattr(tc, "rope_parameters", None), dict) else None
    return LlamaConfig(vocab_size=target.get_output_embeddings().weight.shape[0], hidden_size=hidden,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, intermediate_size=intermediate,
                       tie_word_embeddings=True, rope_theta=float(theta or 10000.0),
                       max_position_embeddings=int(max_pos), eos_token_id=eos_id,
                       bos_token_id=None, pad_token_id=None)


MIN_HELDOUT_TOKENS = 3  # the held-out perplexity's shortest window: one token after the shift


def _checkpoint_dir(target: str | os.PathLike, run: Path) -> Path:
    """An HF checkpoint directory for the target: itself, or a GGUF source converted once into run/target."""
    from specrt.models.gguf_source import is_gguf_source, prepare_gguf

    if not is_gguf_source(target):
        return Path(target)
    converted = run / "target" / "checkpoint"
    if not (converted / "model.safetensors").exists():
        import shutil

        shutil.rmtree(run / "target", ignore_errors=True)
        prepare_gguf(target, run / "target")
    return converted


def _tokens(paths, encode, eos_id: int, cache: Path) -> np.ndarray:
    if cache.exists():
        return np.load(cache)
    arr = encode_documents(encode, read_text_files(paths), eos_id, np.int32)
    np.save(cache, arr)
    return arr


def distill_draft(target_dir: str | os.PathLike, data_paths: Iterable[str | os.PathLike],
                  out_dir: str | os.PathLike, *, layers: int, hidden: int,
                  intermediate: int | None = None, heads: int | None = None,
                  steps: int | None, seq_len: int, batch_size: int, lr: float,
                  max_minutes: float | None = None, progress: bool = True, kv_heads: int = 1,
                  heldout_paths: Iterable[str | os.PathLike] | None = None,
                  run_dir: str | os.PathLike | None = None, warmup: int = 30, seed: int = 0,
                  eval_prompts: int = 32, init_layers: Iterable[int] | None = None, force: bool = False) -> dict:
    """Distil a ``layers`` x ``hidden`` Llama draft from the target in ``target_dir``.

    ``data_paths`` are text files or directories (documents are separated by the
    target's EOS token).  Held-out data come from ``heldout_paths``, or else the last
    5% of the token stream (which is then not trained on).  ``steps=None`` sizes the
    run to ``max_minutes``.  Checkpoints go to ``run_dir`` (default
    ``<out_dir>_run``); the HF-format draft goes to ``out_dir``.  Returns metrics
    including held-out perplexity and greedy acceptance against the target.

    ``init_layers`` (target layer indices): the draft is the target's own architecture with those
    layers plus its embedding, final norm and head (init_draft.py); ``layers``/``hidden``/... are then
    ignored, and the embedding and head stay frozen (the target's) while the layers train.
    ``target_dir`` may also be a GGUF file (or a wheel/zip holding one): it is converted once into
    ``<run_dir>/target``.
    ``out_dir`` and the run directory follow the recipes' output rule (recipes/outputs.py): never an input, an
    existing output only with ``force`` (and then only a checkpoint specrt wrote); it appears whole when training
    is done; the run directory's caches are refused when made for another target, data or draft shape.
    """
    from specrt.compiler.output_dir import HF_CHECKPOINT
    from specrt.recipes.outputs import path_digest, recipe_output

    out = Path(out_dir)
    data_paths = list(data_paths)
    inputs = (Path(target_dir), *map(Path, data_paths), *map(Path, heldout_paths or ()))
    made_for = {"recipe": "distill-draft", "target": path_digest(target_dir),
                "data": [path_digest(p) for p in data_paths], "heldout": [path_digest(p) for p in heldout_paths or ()],
                "draft": [layers, hidden, intermediate, heads, kv_heads, list(init_layers or [])]}
    with recipe_output(out, force, inputs, HF_CHECKPOINT, run_dir, made_for) as (staging, run):
        return _distill(target_dir, data_paths, staging, run, layers=layers, hidden=hidden,
                        intermediate=intermediate, heads=heads, steps=steps, seq_len=seq_len,
                        batch_size=batch_size, lr=lr, max_minutes=max_minutes, progress=progress, kv_heads=kv_heads,
                        heldout_paths=heldout_paths, warmup=warmup, seed=seed, eval_prompts=eval_prompts,
                        init_layers=init_layers)


def _distill(target_dir, data_paths, out: Path, run: Path, *, layers, hidden, intermediate, heads, steps,
             seq_len, batch_size, lr, max_minutes, progress, kv_heads, heldout_paths, warmup, seed, eval_prompts,
             init_layers) -> dict:
    """distill_draft's body: trains (resumable in `run`) and saves the draft into `out` (the staging dir)."""
    target_dir = _checkpoint_dir(target_dir, run)
    dev = pick_device()
    set_seed(seed)
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(dev)
    target.eval().requires_grad_(False)
    eos = _eos_id(tok, target.config)
    enc = hf_encoder(tok)
    train = _tokens(list(data_paths), enc, eos, run / "tokens_train.npy")
    if heldout_paths is not None:
        heldout = _tokens(list(heldout_paths), enc, eos, run / "tokens_heldout.npy")
    else:
        cut = int(len(train) * 0.95)
        train, heldout = train[:cut], train[cut:]
    if len(train) <= seq_len + 1:
        raise InvalidArgument(f"--data holds only {len(train)} training tokens for --seq-len {seq_len}: give more "
                              "text or a smaller --seq-len")
    if eval_prompts and len(heldout) < MIN_HELDOUT_TOKENS:  # checked before training, not after it
        raise InvalidArgument(f"only {len(heldout)} held-out tokens (the last 5% of --data, or the held-out files); "
                              f"evaluating the draft needs {MIN_HELDOUT_TOKENS}: give more text")

    if init_layers is not None:
        from specrt.recipes.init_draft import draft_from_target

        draft = draft_from_target(target, list(init_layers)).to(dev)
        frozen = {id(draft.get_input_embeddings().weight), id(draft.get_output_embeddings().weight)}
        trainable = [p for p in draft.parameters() if id(p) not in frozen]
        for p in draft.parameters():
            p.requires_grad_(id(p) not in frozen)
    else:
        cfg = draft_config(target, eos, layers=layers, hidden=hidden, intermediate=intermediate,
                           heads=heads, kv_heads=kv_heads)
        draft = LlamaForCausalLM(cfg).to(dev)
        trainable = list(draft.parameters())
    draft.train()

    def loss_fn(step: int) -> torch.Tensor:
        x = sample_batch(train, batch_size, seq_len, step, seed + 2, dev)
        with torch.no_grad(), autocast(dev):
            t_logits = target(input_ids=x).logits
        with autocast(dev):
            d_logits = draft(input_ids=x).logits
        v = d_logits.shape[-1]
        logp_t = F.log_softmax(t_logits.float()[..., :v], -1).reshape(-1, v)
        logq = F.log_softmax(d_logits.float(), -1).reshape(-1, v)
        return F.kl_div(logq, logp_t, log_target=True, reduction="batchmean")

    stats = train_loop(draft, trainable, loss_fn, ckpt_path=run / "ckpt.pt",
                       steps=steps, tokens_per_step=batch_size * seq_len, lr=lr, warmup=warmup,
                       max_minutes=max_minutes, progress=progress, desc="distill")
    draft.eval()
    save_hf(draft.cpu(), out, Path(target_dir), eos)
    draft.to(dev)
    metrics = {"train": {k: v for k, v in stats.items() if k != "loss_curve"},
               "loss_curve": stats["loss_curve"],
               "draft_params": sum(p.numel() for p in draft.parameters()),
               "target_params": sum(p.numel() for p in target.parameters()),
               "draft_per_token_params": per_token_params(draft),
               "target_per_token_params": per_token_params(target),
               "train_tokens_available": int(len(train)), "heldout_tokens": int(len(heldout))}
    metrics["per_token_cost_ratio"] = metrics["draft_per_token_params"] / metrics["target_per_token_params"]
    if eval_prompts:
        plen = min(128, max(8, len(heldout) // 4))
        metrics["draft_heldout"] = perplexity(draft, heldout, seq_len=min(seq_len, len(heldout) - 2), max_windows=32)
        metrics["acceptance"] = greedy_acceptance(target, draft, heldout, n_prompts=eval_prompts,
                                                  prompt_len=plen, new_tokens=min(64, plen))
    (run / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics
