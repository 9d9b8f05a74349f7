"""Write the README.md model card of the demo models from their metrics."""
from __future__ import annotations

from pathlib import Path


def _fmt_int(n) -> str:
    return f"{int(n):,}"


def write_model_card(path: str | Path, m: dict) -> None:
    """Render ``metrics.json`` contents as a short Markdown model card."""
    e, c, t, d, md = m["eval"], m["corpus"], m["target"], m["draft"], m["medusa"]
    tc, dc = t["config"], d["config"]
    acc = e["medusa_heldout_accuracy"]
    agree = e["medusa_agreement_with_target_greedy"]
    heads_acc = ", ".join(f"head {i}: {a:.3f}" for i, a in enumerate(acc["head_top1"]))
    heads_agree = ", ".join(f"head {i}: {a:.3f}" for i, a in enumerate(agree))
    text = f"""# specrt demo models

Tiny models for demonstrating speculative decoding with specrt. They are trained
from scratch on CPU in about an hour and are **not** useful language models: they
produce Python-looking text and nothing else.

| | target | draft |
|---|---|---|
| architecture | Llama, {tc['num_hidden_layers']} layers, hidden {tc['hidden_size']}, {tc['num_attention_heads']} heads / {tc['num_key_value_heads']} KV heads, MLP {tc['intermediate_size']} | Llama, {dc['layers']} layers, hidden {dc['hidden']}, {dc['heads']} heads / {dc['kv_heads']} KV head, MLP {dc['intermediate']} |
| parameters | {_fmt_int(t['params'])} | {_fmt_int(d['params'])} |
| parameters used per token (incl. tied lm_head) | {_fmt_int(t['per_token_params'])} | {_fmt_int(d['per_token_params'])} ({d['per_token_cost_ratio']:.3f} of target) |
| training tokens | {_fmt_int(t['train']['tokens_seen'])} (next-token CE) | {_fmt_int(d['train']['tokens_seen'])} (KL distillation from target) |
| held-out perplexity | {e['target_heldout']['perplexity']:.2f} | {e['draft_heldout']['perplexity']:.2f} |

Both share a byte-level BPE tokenizer (vocab {c['vocab_size']}, `<|endoftext|>` = id 0 is the
EOS / document separator, no BOS). Context length 1024 (trained on 512-token windows).
Weights are stored in fp16 (`model.safetensors`); all numbers below were measured on
these fp16 weights upcast to fp32.

**Greedy draft acceptance**: {e['greedy_acceptance']['greedy_acceptance']:.3f}: the fraction of
positions where the draft's argmax equals the target's greedy token, over
{e['greedy_acceptance']['n_prompts']} held-out prompts of {e['greedy_acceptance']['prompt_len']} tokens, each followed by
{e['greedy_acceptance']['new_tokens']} target-greedy tokens (teacher forced).

**Medusa heads** (`medusa/`, {md['num_heads']} heads, one residual SiLU layer each, sharing the
target's lm_head; head i predicts token t+i+2; trained for {_fmt_int(md['train']['tokens_seen'])} tokens with
loss {md['loss']}):
top-1 agreement with the target's greedy tokens: {heads_agree};
top-1 accuracy on held-out text: {heads_acc} (the target's own next-token accuracy is
{acc['base_next_token_top1']:.3f}). Format: `medusa_config.json` + `medusa.safetensors` with
`heads.{{i}}.weight` [D, D] and `heads.{{i}}.bias` [D]; `logits_i = lm_head(h + silu(W_i h + b_i))`
with `h` the target's final (post-norm) hidden state.

## Data

The `.py` source files of the Python {m['python']} standard library (`{c['root']}`),
excluding `site-packages`, `test`, `tests`, `idlelib`, `lib2to3` and files over
200 kB, sorted by relative path. Every 20th file (sorted index 0, 20, 40, ...) is held
out: {c['heldout_files']} held-out files ({_fmt_int(c['heldout_tokens'])} tokens), {c['train_files']} training
files ({_fmt_int(c['train_tokens'])} tokens). The held-out file names are listed in `metrics.json`.
Draft and Medusa heads were trained on the same training split.

## Reproduce

```
{m['command']}
```

(Trained on {m['device']} with torch {m['torch']}, bf16 autocast with fp32 master weights;
wall time: target {m['training_wall_s']['target'] / 60:.1f} min, draft {m['training_wall_s']['draft'] / 60:.1f} min,
Medusa {m['training_wall_s']['medusa'] / 60:.1f} min; date {m['date_utc']}. Results vary slightly with the
machine because the number of steps is fitted to the time budget.)

## Limitations

The target saw only {_fmt_int(t['train']['tokens_seen'])} training tokens (a time budget on a CPU shared
with other work), so it is undertrained: its greedy continuations are often
repetitive (repeated words, punctuation or blank lines).  Repetitive text is easy
for the draft to predict, so the acceptance rate above is higher than it would be
for a well-trained model pair; it is meant to exercise speculative decoding, not
to benchmark it.  Re-run the command with a larger `--target-minutes` on an idle
machine for a better target.

## Licence

The training corpus is the Python standard library, distributed under the Python
Software Foundation License. These model weights are derived from it and are
provided for demonstration and testing only.
"""
    Path(path).write_text(text)
