"""Greedy acceptance of a draft, of n-gram and of hybrid drafting on `specrt demo`'s chat prompts, in PyTorch.

    python scripts/draft_agreement.py TARGET_DIR [--draft DRAFT_DIR | --init-layers 0,10,19,29] [--k 3,5]

The target's greedy continuation of each chat prompt is generated once (transformers); then greedy speculative
decoding is replayed along it: a draft model's proposal at position i is accepted exactly while its
teacher-forced argmax equals the target's token (along the target's own path, the draft's next input is that
token), and the n-gram proposer (runtime/proposers/ngram.py, the real one) is run on the committed tokens. Per
method and k: tokens per target pass (accepted + 1), and acceptance. No speed is measured here: the speed of a
compiled bundle is `scripts/compare_methods.py`'s job.
"""
from __future__ import annotations

import argparse
import json

import numpy as np


def replay(tokens: np.ndarray, start: int, agree: np.ndarray | None, k: int, ngram=None) -> dict:
    """Greedy speculative steps from `start` to the end of `tokens` (the target's greedy path).
    agree[i]: the draft's argmax after tokens[:i+1] equals tokens[i+1]. ngram: an NgramProposer or None."""
    n, steps, drafted, accepted = start, 0, 0, 0
    branch = {"ngram": 0, "draft": 0}
    if ngram is not None:
        ngram.start(tokens, n)
    while n < tokens.size:
        k_here = min(k, tokens.size - n - 1)
        prop = ngram.propose(tokens, n, k_here).token_ids if ngram is not None and k_here > 0 else tokens[:0]
        if prop.size:
            j = 0
            while j < prop.size and prop[j] == tokens[n + j]:
                j += 1
            branch["ngram"] += 1
        elif agree is not None and k_here > 0:
            prop = tokens[n:n + k_here]
            j = 0
            while j < k_here and agree[n - 1 + j]:
                j += 1
            branch["draft"] += 1
        else:
            j = 0
        steps += 1
        drafted += prop.size
        accepted += j
        n += j + 1
        if ngram is not None:
            ngram.observe(min(n, tokens.size), j)
    return {"steps": steps, "drafted": drafted, "accepted": accepted, "branches": branch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("--draft")
    ap.add_argument("--init-layers")
    ap.add_argument("--k", default="3,5")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", dest="out")
    args = ap.parse_args()
    import torch
    import transformers as tf

    from specrt.cli.demo import CHAT_PROMPTS
    from specrt.runtime.proposers.ngram import NgramProposer

    tok = tf.AutoTokenizer.from_pretrained(args.target)
    target = tf.AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    if args.draft:
        draft = tf.AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    else:
        from specrt.recipes.init_draft import draft_from_target, parse_layers

        draft = draft_from_target(target, parse_layers(args.init_layers)).eval()
    eos = {int(tok.eos_token_id)}
    ks = [int(k) for k in args.k.split(",")]
    totals: dict = {}
    for item in CHAT_PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": item["prompt"]}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        with torch.no_grad():
            out = target.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                                  eos_token_id=list(eos), pad_token_id=0)[0]
            d_arg = draft(out[None]).logits[0].argmax(-1)
        tokens = out.numpy().astype(np.int64)
        agree = (d_arg[:-1] == out[1:]).numpy()
        start = len(ids) + 1  # the prefill emits the first new token
        for k in ks:
            for method, a, ng in (("draft", agree, None), ("ngram", None, NgramProposer(frozenset(eos), 1, 3)),
                                  ("hybrid", agree, NgramProposer(frozenset(eos), 2, 3))):
                r = replay(tokens, start, a, k, ng)
                t = totals.setdefault(f"{method} k={k}", {"steps": 0, "drafted": 0, "accepted": 0, "new": 0,
                                                          "branches": {"ngram": 0, "draft": 0}})
                for key in ("steps", "drafted", "accepted"):
                    t[key] += r[key]
                t["new"] += tokens.size - start
                for b, v in r["branches"].items():
                    t["branches"][b] += v
        print(item["kind"], "new tokens", tokens.size - len(ids), "draft agreement", round(float(agree[len(ids):].mean()), 3),
              flush=True)
    for name, t in totals.items():
        t["acceptance"] = t["accepted"] / t["drafted"] if t["drafted"] else 0.0
        t["tokens_per_pass"] = (t["new"]) / t["steps"] if t["steps"] else 0.0
    print(json.dumps(totals, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(totals, f, indent=1)


if __name__ == "__main__":
    main()
