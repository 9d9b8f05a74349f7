"""Training data for a draft head, made by the target itself (self-distillation), computed once and cached.

For each prompt (chat template applied): the target's greedy answer and `samples` sampled answers (temperature
0.8), generated with the PyTorch reference decoder and its KV cache. Per sequence (prompt + answer) the cache
keeps what training reads, so the target never runs again:

    ids        [T] int64            the tokens
    features   [T, D] fp16          the target's final hidden state at every position (the graphs' hidden_states)
    top_ids    [T, K] int32         the target's K most likely next tokens at every position
    top_logits [T, K] fp16          their logits
    prompt_len, greedy (bool), prompt index

`build_dataset` writes `data.pt` in the run directory and resumes a partial `data.partial.pt` (saved every
minute), so an interrupted run loses at most a minute of generation.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import torch

from specrt.models.base import Decoder, empty_past

TOP_K = 32
SAMPLE_TEMPERATURE = 0.8


def default_prompts_path() -> Path:
    """The prompt set shipped in the package (specrt/assets/head/prompts.txt)."""
    from importlib.resources import files

    return Path(str(files("specrt.assets.head") / "prompts.txt"))


def read_prompts(path: Path | None) -> list[str]:
    """One prompt per line (blank lines and lines starting with '#' skipped)."""
    path = Path(path) if path is not None else default_prompts_path()
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    prompts = [ln.replace("\\n", "\n") for ln in lines if ln and not ln.startswith("#")]
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def checkpoint_chat_formatter(target_dir: Path):
    """The checkpoint's chat template: chat_template.jinja wins over tokenizer_config.json (as in transformers);
    none: the plain template."""
    import json

    from specrt.runtime.chat_template import ChatFormatter

    jinja, cfg_path = target_dir / "chat_template.jinja", target_dir / "tokenizer_config.json"
    if not jinja.is_file():
        return ChatFormatter.from_tokenizer_config(cfg_path)
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    token = lambda v: v.get("content", "") if isinstance(v, dict) else (v or "")  # noqa: E731
    return ChatFormatter(jinja.read_text(), token(cfg.get("bos_token")), token(cfg.get("eos_token")))


def chat_encoder(target_dir: Path) -> Callable[[str], list[int]]:
    """prompt text -> token ids through the target's chat template (plain template when it has none)."""
    from tokenizers import Tokenizer

    fmt = checkpoint_chat_formatter(Path(target_dir))
    tok = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))

    def encode(prompt: str) -> list[int]:
        text, add_special = fmt.render([{"role": "user", "content": prompt}])
        return tok.encode(text, add_special_tokens=add_special).ids

    return encode


@torch.no_grad()
def generate_features(decoder: Decoder, prompt_ids: list[int], max_new: int, eos: set[int],
                      temperature: float, gen: torch.Generator) -> dict:
    """One answer by the target (greedy when temperature == 0), with features and top-K logits per position."""
    c = decoder.config
    keys, values = empty_past(c)
    ids = list(prompt_ids)
    feats, top_i, top_v = [], [], []
    step = torch.tensor([prompt_ids], dtype=torch.long)
    pos = 0
    for _ in range(max_new + 1):
        s = step.shape[1]
        out = decoder(step, torch.arange(pos, pos + s)[None, :], keys, values)
        keys = tuple(torch.cat((a, b), 1) for a, b in zip(keys, out.new_keys))
        values = tuple(torch.cat((a, b), 1) for a, b in zip(values, out.new_values))
        pos += s
        logits = out.logits[0]  # [s, V]
        feats.append(out.hidden_states[0].to(torch.float16))
        v, i = logits.topk(TOP_K, dim=-1)
        top_i.append(i.to(torch.int32))
        top_v.append(v.to(torch.float16))
        if len(ids) - len(prompt_ids) >= max_new or ids[-1] in eos and len(ids) > len(prompt_ids):
            break
        last = logits[-1]
        if temperature == 0:
            nxt = int(last.argmax())
        else:
            nxt = int(torch.multinomial(torch.softmax(last / temperature, -1), 1, generator=gen))
        ids.append(nxt)
        step = torch.tensor([[nxt]], dtype=torch.long)
    return {"ids": torch.tensor(ids, dtype=torch.long), "features": torch.cat(feats)[:len(ids)],
            "top_ids": torch.cat(top_i)[:len(ids)], "top_logits": torch.cat(top_v)[:len(ids)],
            "prompt_len": len(prompt_ids), "greedy": temperature == 0}


def build_dataset(decoder: Decoder, encode: Callable[[str], list[int]], prompts: list[str], run_dir: Path, *,
                  max_new: int, samples: int, eos: set[int], seed: int = 0,
                  progress: Callable[[int, int], None] | None = None, max_seconds: float | None = None) -> list[dict]:
    """Sequences for every prompt (greedy + `samples` sampled answers), cached in `run_dir`/data.pt."""
    run_dir = Path(run_dir)
    done_path, partial_path = run_dir / "data.pt", run_dir / "data.partial.pt"
    if done_path.exists():
        return torch.load(done_path, weights_only=True)
    seqs: list[dict] = torch.load(partial_path, weights_only=True) if partial_path.exists() else []
    todo = [(p, j) for p in range(len(prompts)) for j in range(1 + samples)]
    started = saved = time.time()
    for index, (p, j) in enumerate(todo[len(seqs):], start=len(seqs)):
        if max_seconds is not None and time.time() - started > max_seconds:
            break  # the generation budget is spent: train on what there is
        gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
        seq = generate_features(decoder, encode(prompts[p]), max_new, eos, 0.0 if j == 0 else SAMPLE_TEMPERATURE,
                                gen)
        seq["prompt"] = p
        seqs.append(seq)
        if progress is not None:
            progress(len(seqs), len(todo))
        if time.time() - saved > 60:
            _save(seqs, partial_path)
            saved = time.time()
    _save(seqs, done_path)
    partial_path.unlink(missing_ok=True)
    return seqs


def _save(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
