"""Train the specrt demo models end to end (CPU friendly, resumable).

    python -m specrt.recipes.train_demo --out specrt/assets/demo --run-dir /work/train_runs/demo

Stages: corpus -> tokenizer -> target -> distilled draft -> Medusa heads -> fp16
export -> evaluation of the exported weights -> metrics.json + README.md.
Every stage that already finished in ``--run-dir`` is reused; an interrupted
stage resumes from its checkpoint.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from specrt.recipes.common import pick_device
from specrt.recipes.corpus import stdlib_corpus
from specrt.recipes.distill import distill_draft, per_token_params
from specrt.recipes.evaluate import draft_acceptance, eval_sequences, medusa_accuracy, medusa_agreement, perplexity
from specrt.recipes.medusa import load_medusa, save_medusa, train_medusa
from specrt.recipes.model_card import write_model_card
from specrt.recipes.tokenizer import prepare_stdlib_tokens
from specrt.recipes.train_target import save_hf, train_target

DRAFT_SHAPE = dict(layers=2, hidden=192, intermediate=512, heads=3, kv_heads=1)
MEDUSA_HEADS = 3


def _done(path: Path) -> dict | None:
    """Metrics of a finished stage, or None if the stage has to (re)run."""
    if not path.exists():
        return None
    m = json.loads(path.read_text())
    return m if m.get("completed", m.get("train", {}).get("completed")) else None


def _load(path: Path, dev) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev).eval()


def run(args) -> dict:
    t0 = time.time()
    run_dir, out = Path(args.run_dir), Path(args.out)
    dev = pick_device()
    data = prepare_stdlib_tokens(run_dir)
    corpus = stdlib_corpus()

    tgt_m = _done(run_dir / "target" / "train_metrics.json") or train_target(
        data["train"], run_dir / "target", data["tokenizer_dir"], steps=args.target_steps,
        max_minutes=args.target_minutes, batch_size=8, seq_len=512, lr=2e-3)
    target_dir = run_dir / "target" / "final"

    drf_m = _done(run_dir / "draft" / "metrics.json") or distill_draft(
        target_dir, corpus["train_files"], run_dir / "draft" / "final", **DRAFT_SHAPE,
        steps=args.draft_steps, seq_len=512, batch_size=8, lr=3e-3, max_minutes=args.draft_minutes,
        heldout_paths=corpus["heldout_files"], run_dir=run_dir / "draft", eval_prompts=8)

    med_path = run_dir / "medusa" / "train_metrics.json"
    med_m = _done(med_path)
    if med_m is None:
        target = _load(target_dir, dev)
        heads, med_m = train_medusa(target, data["train"], run_dir / "medusa", num_heads=MEDUSA_HEADS,
                                    steps=args.medusa_steps, max_minutes=args.medusa_minutes)
        save_medusa(heads, run_dir / "medusa" / "final", target.config.vocab_size, torch.float32)
        med_path.write_text(json.dumps(med_m, indent=1) + "\n")

    # Export in fp16, then evaluate exactly what was exported (upcast to fp32).
    tok_dir = data["tokenizer_dir"]
    for name, src in (("target", target_dir), ("draft", run_dir / "draft" / "final")):
        save_hf(_load(src, "cpu"), out / name, tok_dir, 0, dtype=torch.float16)
    heads, _ = load_medusa(run_dir / "medusa" / "final")
    save_medusa(heads, out / "medusa", json.loads((target_dir / "config.json").read_text())["vocab_size"])

    print("[eval] evaluating exported fp16 weights (upcast to fp32)", flush=True)
    target, draft = _load(out / "target", dev), _load(out / "draft", dev)
    heads, _ = load_medusa(out / "medusa")
    heads = heads.to(dev)
    held = data["heldout"]
    nw, npr = args.eval_windows, args.eval_prompts
    ev = {"target_heldout": perplexity(target, held, max_windows=nw),
          "draft_heldout": perplexity(draft, held, max_windows=nw)}
    seqs = eval_sequences(target, held, n_prompts=npr, prompt_len=128, new_tokens=64)
    ev["greedy_acceptance"] = draft_acceptance(draft, seqs, 128)
    ev["greedy_acceptance"].update(n_prompts=int(seqs.shape[0]), prompt_len=128, new_tokens=64)
    ev["target_self_agreement"] = draft_acceptance(target, seqs, 128)["greedy_acceptance"]
    ev["medusa_agreement_with_target_greedy"] = medusa_agreement(target, heads, seqs, 128)
    ev["medusa_heldout_accuracy"] = medusa_accuracy(target, heads, held, max_windows=max(1, nw // 4))

    metrics = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m specrt.recipes.train_demo " + " ".join(args.argv),
        "device": str(dev), "torch": torch.__version__, "python": sys.version.split()[0],
        "corpus": {k: data["info"][k] for k in ("root", "train_bytes", "heldout_bytes",
                                                "train_tokens", "heldout_tokens", "vocab_size")}
        | {"train_files": len(data["info"]["train_names"]), "heldout_files": len(data["info"]["heldout_names"]),
           "heldout_names": data["info"]["heldout_names"]},
        "target": {"params": sum(p.numel() for p in target.parameters()),
                   "per_token_params": per_token_params(target),
                   "config": {k: getattr(target.config, k) for k in (
                       "hidden_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "intermediate_size", "vocab_size")},
                   "train": {k: v for k, v in tgt_m.items() if k != "loss_curve"}},
        "draft": {"params": sum(p.numel() for p in draft.parameters()),
                  "per_token_params": per_token_params(draft),
                  "config": dict(DRAFT_SHAPE), "train": drf_m["train"],
                  "distill_eval_during_training": {k: drf_m.get(k) for k in ("draft_heldout", "acceptance")}},
        "medusa": {"num_heads": MEDUSA_HEADS, "params": sum(p.numel() for p in heads.parameters()),
                   "loss": "KL(target next-token dist at t+i+1 || head i at t)",
                   "train": {k: v for k, v in med_m.items() if k != "loss_curve"}},
        "eval": ev,
    }
    metrics["draft"]["per_token_cost_ratio"] = metrics["draft"]["per_token_params"] / metrics["target"]["per_token_params"]
    metrics["training_wall_s"] = {"target": tgt_m["wall_s"], "draft": drf_m["train"]["wall_s"],
                                  "medusa": med_m["wall_s"]}
    metrics["this_invocation_wall_s"] = time.time() - t0
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    write_model_card(out / "README.md", metrics)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"[done] {out}: {size / 1e6:.1f} MB", flush=True)
    if size > 40e6:
        print("[warn] demo assets exceed 40 MB", flush=True)
    return metrics


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (specrt/assets/demo)")
    ap.add_argument("--run-dir", required=True, help="checkpoints and caches (resumable)")
    ap.add_argument("--target-minutes", type=float, default=28.0)
    ap.add_argument("--draft-minutes", type=float, default=15.0)
    ap.add_argument("--medusa-minutes", type=float, default=8.0)
    ap.add_argument("--target-steps", type=int, default=None, help="default: fit the time budget")
    ap.add_argument("--draft-steps", type=int, default=None)
    ap.add_argument("--medusa-steps", type=int, default=None)
    ap.add_argument("--eval-windows", type=int, default=128, help="512-token perplexity windows")
    ap.add_argument("--eval-prompts", type=int, default=32, help="prompts for greedy acceptance")
    args = ap.parse_args(argv)
    args.argv = argv
    m = run(args)
    e = m["eval"]
    print(json.dumps({"target_ppl": e["target_heldout"]["perplexity"], "draft_ppl": e["draft_heldout"]["perplexity"],
                      "greedy_acceptance": e["greedy_acceptance"]["greedy_acceptance"],
                      "medusa_agreement": e["medusa_agreement_with_target_greedy"]}, indent=1))


if __name__ == "__main__":
    main()
