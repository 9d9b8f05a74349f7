"""Offline distillation text for a chat target: the target's own sampled answers to generated chat prompts.

    python scripts/chat_distill_data.py --target CKPT_DIR --out DIR [--prompts 96] [--new-tokens 160]

Prompts come from templates (rewrite / fix / summarise a paragraph taken from Python's standard-library
docstrings, and open questions on a list of topics); none of them is one of `specrt demo`'s prompts. Each answer
is sampled (temperature 0.8) with transformers in batches and written, rendered with the target's chat
template, as one text file per prompt: a draft distilled on them sees the template tokens and the target's
own style. Deterministic for a given seed.
"""
from __future__ import annotations

import argparse
import ast
import random
import sysconfig
from pathlib import Path

TASKS = ("Rewrite this text in simpler words:\n\n{p}", "Fix any grammar mistakes in this text and return it:\n\n{p}",
         "Summarize this text in one sentence:\n\n{p}", "Make this text more formal:\n\n{p}",
         "List the main points of this text:\n\n{p}")
TOPICS = ("drinking enough water", "learning a new language", "saving money", "sleeping well", "writing an essay",
          "planting a garden", "keeping a pet healthy", "giving a good presentation", "cooking rice", "riding a bike",
          "reducing stress", "reading more books", "working from home", "making new friends", "recycling at home",
          "preparing for a job interview", "staying safe online", "training for a 5k run", "taking better notes",
          "traveling on a budget")
QUESTIONS = ("What are some tips for {t}?", "Why is {t} important?", "Explain {t} to a ten-year-old.",
             "Give me a short plan for {t}.")


def paragraphs(limit: int, rng: random.Random) -> list[str]:
    """English paragraphs of 25-90 words from the standard library's module docstrings."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for para in (doc or "").split("\n\n"):
            words = para.split()
            if 25 <= len(words) <= 90 and sum(w.isalpha() for w in words) > 0.7 * len(words):
                found.append(" ".join(words))
    rng.shuffle(found)
    return found[:limit]


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    paras = paragraphs(n, rng)
    out = [rng.choice(TASKS).format(p=p) for p in paras[: n // 2]]
    while len(out) < n:
        out.append(rng.choice(QUESTIONS).format(t=rng.choice(TOPICS)))
    rng.shuffle(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    import transformers as tf

    torch.manual_seed(args.seed)
    tok = tf.AutoTokenizer.from_pretrained(args.target)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = tf.AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    args.out.mkdir(parents=True, exist_ok=True)
    items = prompts(args.prompts, args.seed)
    for b in range(0, len(items), args.batch_size):
        chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                 for p in items[b:b + args.batch_size]]
        enc = tok(chats, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.new_tokens, do_sample=True, temperature=0.8, top_p=0.95,
                                 pad_token_id=tok.pad_token_id)
        for i, (chat, row) in enumerate(zip(chats, out)):
            answer = tok.decode(row[enc["input_ids"].shape[1]:], skip_special_tokens=False)
            end = answer.find(tok.eos_token)  # padding after the answer's end (pad may equal EOS)
            answer = answer[:end + len(tok.eos_token)] if end >= 0 else answer
            (args.out / f"chat_{b + i:04d}.txt").write_text(chat + answer, encoding="utf-8")
        print(f"{min(b + args.batch_size, len(items))}/{len(items)} answers", flush=True)


if __name__ == "__main__":
    main()
