"""Evaluation: held-out perplexity, greedy draft acceptance and Medusa head accuracy.

Greedy acceptance of a draft against a target is measured as follows: take
``n_prompts`` windows of ``prompt_len`` tokens evenly spaced over the held-out
token stream, let the target generate ``new_tokens`` greedy tokens after each,
then run the draft teacher-forced on prompt + continuation and count the
positions where the draft's argmax equals the target's greedy token.  That is the
per-token acceptance probability of greedy speculative decoding.  Medusa head i
is scored the same way against the target's greedy token at t + i + 2.
All evaluation runs in fp32 without autocast.
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import torch
import torch.nn.functional as F


def _windows(n_tokens: int, length: int, count: int) -> np.ndarray:
    """Evenly spaced, deterministic window starts (non-overlapping when possible)."""
    count = max(1, min(count, n_tokens // length))
    return np.linspace(0, n_tokens - length, count).astype(np.int64)


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def perplexity(model, tokens: np.ndarray, seq_len: int = 512, max_windows: int = 128,
               batch_size: int = 8) -> dict:
    """Held-out perplexity over up to ``max_windows`` windows of ``seq_len + 1`` tokens."""
    model.eval()
    dev = _device(model)
    starts = _windows(len(tokens), seq_len + 1, max_windows)
    nll, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        x = torch.from_numpy(np.stack([tokens[s:s + seq_len + 1] for s in starts[i:i + batch_size]])
                             .astype(np.int64)).to(dev)
        logits = model(input_ids=x[:, :-1]).logits.float()
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                               reduction="sum").item()
        count += x[:, 1:].numel()
    return {"perplexity": math.exp(nll / count), "nll": nll / count, "tokens": count}


@torch.no_grad()
def greedy_generate(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation with KV cache (EOS is not special: always ``new_tokens``)."""
    model.eval()
    # transformers >= 5.x names the KV cache ``cache``; older versions ``past_key_values``
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=prompts, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1)
    generated = [nxt]
    for _ in range(new_tokens - 1):
        cache = getattr(out, "cache", None)
        cache = cache if cache is not None else out.past_key_values
        out = model(input_ids=nxt[:, None], use_cache=True, **{key: cache})
        nxt = out.logits[:, -1].argmax(-1)
        generated.append(nxt)
    return torch.cat([prompts, torch.stack(generated, 1)], 1)


def eval_sequences(target, tokens: np.ndarray, n_prompts: int = 32, prompt_len: int = 128,
                   new_tokens: int = 64) -> torch.Tensor:
    """Held-out prompts followed by the target's greedy continuation: [n, prompt+new]."""
    starts = _windows(len(tokens), prompt_len, n_prompts)
    prompts = torch.from_numpy(np.stack([tokens[s:s + prompt_len] for s in starts])
                               .astype(np.int64)).to(_device(target))
    return greedy_generate(target, prompts, new_tokens)


@torch.no_grad()
def draft_acceptance(draft, seqs: torch.Tensor, prompt_len: int = 128) -> dict:
    """Fraction of continuation tokens where the draft's teacher-forced argmax equals
    the target's greedy token, plus the implied mean accepted run length."""
    draft.eval()
    logits = draft(input_ids=seqs.to(_device(draft))[:, :-1]).logits
    pred = logits[:, prompt_len - 1:].argmax(-1).cpu()
    match = (pred == seqs[:, prompt_len:].cpu()).float()
    return {"greedy_acceptance": match.mean().item(), "positions": match.numel()}


def greedy_acceptance(target, draft, tokens: np.ndarray, n_prompts: int = 32,
                      prompt_len: int = 128, new_tokens: int = 64) -> dict:
    """Greedy acceptance of ``draft`` against ``target`` on held-out ``tokens``."""
    seqs = eval_sequences(target, tokens, n_prompts, prompt_len, new_tokens)
    res = draft_acceptance(draft, seqs, prompt_len)
    res.update(n_prompts=int(seqs.shape[0]), prompt_len=prompt_len, new_tokens=new_tokens)
    return res


@torch.no_grad()
def medusa_agreement(target, heads, seqs: torch.Tensor, prompt_len: int = 128) -> list[float]:
    """Top-1 agreement of each Medusa head with the target's greedy tokens: head i at
    position t is compared with the greedy token at t + i + 2 (continuation only)."""
    from specrt.recipes.medusa import final_hidden, head_logits

    h, _ = final_hidden(target, seqs.to(_device(target)))
    out = []
    for i, logits in enumerate(head_logits(target, heads, h)):
        lo = prompt_len - i - 2
        pred = logits[:, lo:seqs.shape[1] - i - 2].argmax(-1).cpu()
        out.append((pred == seqs[:, prompt_len:].cpu()).float().mean().item())
    return out


@torch.no_grad()
def medusa_accuracy(target, heads, tokens: np.ndarray, seq_len: int = 512,
                    max_windows: int = 32, batch_size: int = 8) -> dict:
    """Held-out top-1 accuracy against the true tokens: the base LM head on t + 1
    and Medusa head i on t + i + 2."""
    from specrt.recipes.medusa import final_hidden, head_logits

    n = len(heads.heads)
    starts = _windows(len(tokens), seq_len + n + 1, max_windows)
    dev = _device(target)
    correct = torch.zeros(n + 1)
    total = torch.zeros(n + 1)
    for b in range(0, len(starts), batch_size):
        x = torch.from_numpy(np.stack([tokens[s:s + seq_len + n + 1] for s in starts[b:b + batch_size]])
                             .astype(np.int64)).to(dev)
        h, logits = final_hidden(target, x[:, :seq_len])
        correct[0] += (logits.argmax(-1) == x[:, 1:seq_len + 1]).sum().cpu()
        total[0] += logits.shape[0] * logits.shape[1]
        for i, lg in enumerate(head_logits(target, heads, h)):
            correct[i + 1] += (lg.argmax(-1) == x[:, i + 2:seq_len + i + 2]).sum().cpu()
            total[i + 1] += lg.shape[0] * lg.shape[1]
    acc = (correct / total).tolist()
    return {"base_next_token_top1": acc[0], "head_top1": acc[1:], "tokens_per_head": int(total[0])}
