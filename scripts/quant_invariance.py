"""Batch invariance of the quantized fused graph: does a verify pass over k+1 tokens give the same argmax rows
as k+1 one-token passes? One-off measurement behind README's quantization section (issue 14).

    python scripts/quant_invariance.py BUNDLE --out /tmp/qf/inv [--prompts 20 --tokens 200 --blocks 32,128
                                       --levels 1,4 --threads 2]

BUNDLE: an fp32 bundle with a fused target graph (specrt compile ... --ort-graph fused). For each block size the
fused graph is quantized once (int4, symmetric); each accuracy level is the same weights with the node attribute
changed. Per (block, level), for each prompt: plain greedy decoding of `--tokens` tokens with one-token passes
(the reference, timed), at level 4 the same with every one-token pass padded to two rows ("pad2": the second row
repeats the token and is discarded), and for k = 1..8 teacher-forced verify passes of k+1 tokens over the plain sequence (full
acceptance: each window starts where the last ended). Reported: rows whose argmax equals plain decoding's, the
largest logit difference, and decode / verify speed. Results go to OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from specrt.bundle.manifest import read_manifest
from specrt.compiler.fused_scorer import FusedScorer
from specrt.compiler.quantize import QuantizeConfig
from specrt.compiler.quantize_fused import quantize_fused_onnx, with_accuracy_level

PROMPTS = [
    "The history of the printing press", "def quicksort(items):", "Explain why the sky is blue.",
    "Once upon a time, in a small village", "import numpy as np\n\n", "The three laws of thermodynamics are",
    "Write a haiku about autumn.", "SELECT name, COUNT(*) FROM", "In 1969, astronauts", "Dear hiring manager,",
    "The recipe for bread needs", "A list of prime numbers: 2, 3, 5,", "class LinkedList:\n    def __init__(self):",
    "The capital of France is", "Photosynthesis converts", "To install the package, run",
    "My favourite book is", "The mitochondria is", "function add(a, b) {", "Q: What is 12 times 7?\nA:",
]


def plain(scorer: FusedScorer, prompt: np.ndarray, n: int, pad: int = 1) -> tuple[list[int], list[np.ndarray], float]:
    """Greedy decoding with one-token passes (each padded to `pad` rows). Returns tokens, logits rows, seconds."""
    logits, past = scorer.run(prompt, 0, last_only=True)
    tokens, rows = [int(logits[-1].argmax())], [logits[-1].copy()]
    t0 = time.perf_counter()
    for _ in range(n - 1):
        logits, _ = scorer.run(np.array([tokens[-1]] * pad, dtype=np.int64), past)
        past += 1
        rows.append(logits[0].copy())
        tokens.append(int(logits[0].argmax()))
    return tokens, rows, time.perf_counter() - t0


def verify(scorer: FusedScorer, prompt: np.ndarray, tokens: list[int], rows: list[np.ndarray], k: int):
    """Teacher-forced (k+1)-token passes over the plain sequence. Returns (rows, equal, max diff, seconds, passes)."""
    full = np.concatenate([prompt, np.asarray(tokens, dtype=np.int64)])
    _, past = scorer.run(prompt[:-1], 0) if prompt.size > 1 else (None, 0)
    n = prompt.size  # committed tokens; the cache holds n - 1
    compared = equal = passes = 0
    worst, seconds = 0.0, 0.0
    while n + k < full.size:
        t0 = time.perf_counter()
        logits, _ = scorer.run(full[n - 1:n + k], n - 1)
        seconds += time.perf_counter() - t0
        passes += 1
        for i in range(k + 1):
            ref = rows[n - prompt.size + i]
            compared += 1
            equal += int(logits[i].argmax() == ref.argmax())
            worst = max(worst, float(np.abs(logits[i] - ref).max()))
        n += k + 1
    return compared, equal, worst, seconds, passes


def measure(path: Path, dims: dict, prompts: list[np.ndarray], n: int, threads: int, pad2: bool) -> dict:
    scorer = FusedScorer(path, dims, capacity=1024, threads=threads)
    out = {"plain_tokens": 0, "plain_s": 0.0, "pad2_s": 0.0, "pad2_equal": 0, "pad2_max_diff": 0.0, "k": {}}
    for k in range(1, 9):
        out["k"][k] = {"rows": 0, "equal": 0, "max_diff": 0.0, "pad2_equal": 0, "pad2_max_diff": 0.0, "s": 0.0,
                       "passes": 0}
    for prompt in prompts:
        tokens, rows, s = plain(scorer, prompt, n)
        out["plain_tokens"] += len(tokens) - 1
        out["plain_s"] += s
        tokens2, rows2, s2 = plain(scorer, prompt, n, pad=2) if pad2 else (tokens, rows, s)
        out["pad2_s"] += s2
        out["pad2_equal"] += sum(int(a == b) for a, b in zip(tokens, tokens2))
        out["pad2_max_diff"] = max(out["pad2_max_diff"], max(float(np.abs(a - b).max()) for a, b in zip(rows, rows2)))
        for k in range(1, 9):
            rec = out["k"][k]
            c, e, w, vs, vp = verify(scorer, prompt, tokens, rows, k)
            _, e2, w2, _, _ = verify(scorer, prompt, tokens2, rows2, k) if pad2 else (c, e, w, vs, vp)
            rec["rows"] += c
            rec["equal"] += e
            rec["pad2_equal"] += e2
            rec["max_diff"] = max(rec["max_diff"], w)
            rec["pad2_max_diff"] = max(rec["pad2_max_diff"], w2)
            rec["s"] += vs
            rec["passes"] += vp
    out["plain_tok_s"] = out["plain_tokens"] / out["plain_s"]
    out["pad2_tok_s"] = out["plain_tokens"] / out["pad2_s"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--blocks", default="32,128")
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    m = read_manifest(args.bundle)
    entry = m.models["target"]
    c = entry.decoder_config
    dims = {"num_layers": c.num_layers, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim}
    tok = Tokenizer.from_file(str(m.path(m.tokenizer.path)))
    prompts = [np.asarray(tok.encode(p).ids, dtype=np.int64) for p in PROMPTS[:args.prompts]]
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    fused = m.path(entry.graphs["fused"].onnx)
    for block in map(int, args.blocks.split(",")):
        base = args.out / f"b{block}" / "fused.int4.onnx"
        if not base.exists():
            base.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            quantize_fused_onnx(fused, base, QuantizeConfig("int4", block_size=block, accuracy_level=1))
            print(f"quantized block {block} in {time.perf_counter() - t0:.0f} s", flush=True)
        for level in map(int, args.levels.split(",")):
            key = f"b{block}_l{level}"
            if key in results:
                continue
            path = with_accuracy_level(base, base.parent / f"fused.int4.l{level}.onnx", level)
            t0 = time.perf_counter()
            results[key] = measure(path, dims, prompts, args.tokens, args.threads, pad2=level == 4)
            results[key]["conditions"] = {"prompts": len(prompts), "tokens": args.tokens, "threads": args.threads}
            r = results[key]
            print(f"{key}: plain {r['plain_tok_s']:.1f} tok/s, pad2 {r['pad2_tok_s']:.1f} tok/s, "
                  f"pad2==plain {r['pad2_equal']}/{len(prompts) * args.tokens}; "
                  + " ".join(f"k{k}:{v['equal']}|{v['pad2_equal']}/{v['rows']}" for k, v in r["k"].items())
                  + f" max diff {max(v['max_diff'] for v in r['k'].values()):.2g}"
                  + f"|{max(v['pad2_max_diff'] for v in r['k'].values()):.2g}"
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
            results_path.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
