"""The fused head to ship: the best held-out measure of a run (RUN/fit/best.pt) written as a head directory.

`export_fused_head(target, run, out)` writes what `specrt train-head --recipe fused -o DIR` writes (head_config.json
version 2 + head.safetensors with the trained parameters only: fc [D, 5D] and the layer; compile rebuilds the
frozen parts, the embedding, the final norm and the kept lm_head rows, from the target), in fp16 by default (half
the size; the loaders upcast to fp32) or, with `dtype=torch.int8`, int8 weight matrices with per-row scales (a
quarter: specrt/models/head_storage.py, `storage` in head_config.json), plus metrics.json and a README.md model card
(`fused_head_card`): the data (prompts, styles, tokens), the steps, the CPU time and the learning curve
(RUN/fit/curve.jsonl). `convert_fused_head` rewrites an exported head directory in another storage (no run needed).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specrt.models.base import Decoder


def read_curve(fit_dir: Path) -> list[dict]:
    path = Path(fit_dir) / "curve.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def export_fused_head(target: Decoder, run_dir: Path, out: Path, *, dtype: torch.dtype = torch.float16,
                      about: dict | None = None) -> dict:
    """Write the best head of `run_dir` (the recipe's run directory: shards/ and fit/) into `out`, its parameters
    stored as `dtype` (float32, float16 or int8); returns the metrics (also metrics.json). `about`: what the card
    states beyond the curve ("target", "data", "cost", "curve_notes", "storage_notes": see `fused_head_card`)."""
    from specrt.models.draft_head_fused import save_fused_head
    from specrt.models.head_storage import storage_of_dtype
    from specrt.recipes.head_fit import best_fused_head

    storage_of_dtype(dtype)  # float32 / float16 / int8, else ValueError before anything is written
    run_dir, out = Path(run_dir), Path(out)
    head, line = best_fused_head(target, run_dir / "fit")
    metrics = {"recipe": "fused", "feature_layers": list(head.feature_layers),
               "draft_vocab_size": head.draft_vocab_size, "ttt_depth": len(line.get("heldout_per_position", [])),
               "steps": line["step"], "tokens_seen": line["tokens_seen"], "train_tokens": line["train_tokens"],
               "train_sequences": line["train_sequences"],
               "heldout_acceptance": {k[len("heldout_"):]: v for k, v in line.items() if k.startswith("heldout_")},
               "weights_dtype": str(dtype).replace("torch.", ""), **(about or {})}
    save_fused_head(head, out, extra={"training": metrics}, dtype=dtype)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (out / "README.md").write_text(fused_head_card(metrics, read_curve(run_dir / "fit")))
    return metrics


def convert_fused_head(src: Path, out: Path, curve: list[dict], *, dtype: torch.dtype = torch.int8,
                       about: dict | None = None) -> dict:
    """Rewrite the exported head directory `src` into `out` (may be `src`) with its parameters stored as `dtype`;
    metrics.json gains `about` and the card is rewritten (`curve`: its learning curve, as `read_curve` gives it,
    cut at the exported step). Returns the metrics, with `max_abs_error` per tensor of the conversion."""
    from specrt.models.head_storage import convert_head_dir, storage_of_dtype

    errors = convert_head_dir(Path(src), Path(out), storage_of_dtype(dtype))
    path, config = Path(out) / "metrics.json", Path(out) / "head_config.json"
    metrics = {**json.loads(path.read_text()), **(about or {})}
    path.write_text(json.dumps(metrics, indent=1) + "\n")
    cfg = json.loads(config.read_text())
    cfg["training"] = {**cfg.get("training", {}), **(about or {})}
    config.write_text(json.dumps(cfg) + "\n")
    (Path(out) / "README.md").write_text(fused_head_card(metrics, [x for x in curve if x["step"] <= metrics["steps"]]))
    return {**metrics, "max_abs_error": errors}


def curve_table(curve: list[dict]) -> str:
    """The learning curve as a Markdown table (step, tokens, held-out top-1, per position, conditional)."""
    rows = ["| step | loss rows seen | training tokens then | teacher-forced top-1 | per position | conditional |",
            "|---|---|---|---|---|---|"]
    for x in curve:
        per = " / ".join(f"{v:.3f}" for v in x.get("heldout_per_position", []))
        cond = " / ".join(f"{v:.3f}" for v in x.get("heldout_conditional", []))
        rows.append(f"| {x['step']} | {x['tokens_seen'] / 1000:.0f}k | {x['train_tokens'] / 1000:.0f}k | "
                    f"{x.get('heldout_tf_top1', float('nan')):.3f} | {per} | {cond} |")
    return "\n".join(rows)


def fused_head_card(m: dict, curve: list[dict]) -> str:
    """README.md of a fused head directory from its metrics and its learning curve."""
    a = m["heldout_acceptance"]
    rows = "\n".join(f"| {i + 1} | {r:.3f} | {c:.3f} |"
                     for i, (r, c) in enumerate(zip(a.get("per_position", []), a.get("conditional", []))))
    target = Path(m["target"]).name if m.get("target") else "its target"
    data = f"\n## Data\n\n{m['data']}\n" if m.get("data") else ""
    cost = f"\n## Cost\n\n{m['cost']}\n" if m.get("cost") else ""
    notes = f"\n\n{m['curve_notes']}" if m.get("curve_notes") else ""
    dtype = m.get("weights_dtype", "float32")
    stored = ("int8 weight matrices with a float32 scale per\noutput row, biases and norms float16" if dtype == "int8"
              else dtype)
    storage = f"\n## Storage\n\n{m['storage_notes']}\n" if m.get("storage_notes") else ""
    return f"""# Fused draft head for {target}

EAGLE-3-style: fc over [final feature ; token embedding ; the target's layers {m['feature_layers']}] + one layer
initialised from the target's last, {m['draft_vocab_size']} tokens; training-time test over {m['ttt_depth']} depths,
trained by `specrt train-head --recipe fused` on the target's own answers ({m['train_tokens']:,} training tokens,
{m['steps']} steps). The directory holds the trained parameters only (fc and the layer: {stored}); `specrt compile`
rebuilds the frozen parts (embedding, final norm, kept lm_head rows) from the target (docs/draft-head.md, "The
fused head").
{data}
## Held-out greedy acceptance ({a.get('positions')} chains; teacher-forced top-1 {a.get('tf_top1')})

The head of the best held-out measure (step {m['steps']}); acceptance per drafted token at k = {m['ttt_depth']}:
{a.get('acceptance')}.

| draft position i | P(drafts 1..i accepted) | P(draft i accepted given 1..i-1) |
|---|---|---|
{rows}
{storage}{cost}
## Learning curve

{curve_table(curve) if curve else "(no curve recorded)"}{notes}
"""
