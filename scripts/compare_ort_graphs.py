"""Side-by-side timing of a bundle's ONNX Runtime graph variants (backend ort-portable vs ort = fused),
interleaved in one run: decode tok/s for plain / n-gram / draft decoding (greedy, outputs compared) and
time to first token on a long prompt (prefill computing every row's logits vs the last row only).

    python scripts/compare_ort_graphs.py BUNDLE [--tokens 128] [--rounds 3] [--k 4] [--ttft-prompt 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from specrt.runtime import load

PROMPTS = ["def parse_args(argv):\n    parser = argparse.ArgumentParser(", "import os\nimport sys\n\n\ndef main(",
           "The history of the city begins"]


def ttft(runner, ids: np.ndarray, last_only: bool) -> float:
    """Seconds to prefill `ids` in 256-token chunks and return the last logits row."""
    runner.reset()
    t = time.perf_counter()
    if last_only:
        runner.prefill(ids, 256)
    else:  # what prefill did before Runner.forward_last: every row's logits, keep the last
        for start in range(0, ids.size, 256):
            row = runner.forward(ids[start:start + 256])[-1]
        row.copy()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--ttft-prompt", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--methods", default="none,ngram,draft", help="comma-separated; empty: only time to first token")
    args = ap.parse_args()
    gens = {b: load(args.bundle, backend=b, threads=args.threads) for b in ("ort-portable", "ort")}
    methods = [m for m in args.methods.split(",") if m in gens["ort"].methods]
    rates: dict[str, list[float]] = {}
    outputs: dict[tuple, list[int]] = {}
    for _ in range(args.rounds):
        for method in methods:
            for prompt in PROMPTS:
                for backend, gen in gens.items():
                    res = gen.generate(prompt, args.tokens, method=method, num_speculative_tokens=args.k)
                    rates.setdefault(f"{backend} {method}", []).append(res.stats.decode_tokens_per_second)
                    outputs.setdefault((backend, method, prompt), res.token_ids)
    same = None if not methods else all(outputs[("ort", m, p)] == outputs[("ort-portable", m, p)] == outputs[("ort-portable", "none", p)]
               for m in methods for p in PROMPTS)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, gens["ort"].vocab_size, args.ttft_prompt).astype(np.int64)
    ttfts: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for backend, gen in gens.items():
            for last_only in (False, True):
                ttfts.setdefault(f"{backend} {'last-row' if last_only else 'all-rows'}", []).append(
                    ttft(gen.target, ids, last_only))
    report = {"decode_tok_s_median": {k: round(statistics.median(v), 1) for k, v in rates.items()},
              "ttft_ms_median": {k: round(1000 * statistics.median(v), 1) for k, v in ttfts.items()},
              "greedy_outputs_identical": same, "tokens": args.tokens, "rounds": args.rounds, "k": args.k,
              "ttft_prompt_tokens": args.ttft_prompt, "threads": gens["ort"].target.describe().get("threads")}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
