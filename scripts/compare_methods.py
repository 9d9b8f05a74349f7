"""Plain vs every drafting method on `specrt demo`'s chat prompts, interleaved, greedy, on one bundle.

    python scripts/compare_methods.py BUNDLE [--methods none,ngram,draft,hybrid] [--k auto] [--repeats 3]
                                             [--max-new-tokens 128] [--json OUT]

Per prompt: one warm-up run of each method, then `repeats` rounds in which every method runs once (the order
rotates each round, so drift in machine load spreads over all methods). Reports per method and prompt the
median tokens per second, its speedup over plain (`none`), acceptance, whether the output equals plain's, and
for hybrid how many steps each branch drafted; the summary is the geometric mean over prompts.
"""
from __future__ import annotations

import argparse
import json
import statistics


def run(bundle: str, methods: list[str], k, repeats: int, max_new_tokens: int) -> dict:
    from specrt.cli.demo import CHAT_PROMPTS
    from specrt.runtime import load
    from specrt.serve.chat import ChatFormatter, chat_prompt_ids

    gen = load(bundle, backend="ort")
    fmt = ChatFormatter.from_manifest(gen.manifest)
    rows = []
    for item in CHAT_PROMPTS:
        ids = chat_prompt_ids(gen, item["prompt"], item.get("system"), fmt)

        def once(m):
            opts = {"method": m} if m == "none" else {"method": m, "num_speculative_tokens": k}
            return gen.generate(ids, max_new_tokens, **opts)

        for m in methods:
            once(m)
        tps = {m: [] for m in methods}
        last = {}
        for r in range(repeats):
            for m in methods[r % len(methods):] + methods[:r % len(methods)]:
                res = once(m)
                tps[m].append(res.stats.tokens_per_second)
                last[m] = res
        row = {"kind": item["kind"], "text": last["none"].text if "none" in last else None}
        for m in methods:
            s = last[m].stats
            row[m] = {"tokens_per_second": statistics.median(tps[m]), "all": tps[m],
                      "identical": last[m].token_ids == last["none"].token_ids if "none" in last else None,
                      "acceptance_rate": s.acceptance_rate, "mean_accepted_tokens": s.mean_accepted_tokens,
                      "drafted": s.drafted_tokens, "accepted": s.accepted_tokens, "branches": s.branches,
                      "new_tokens": len(last[m].token_ids)}
        rows.append(row)
        print(json.dumps({"kind": item["kind"], **{m: round(row[m]["tokens_per_second"], 1) for m in methods}}),
              flush=True)
    summary = {}
    for m in methods:
        geo = statistics.geometric_mean([r[m]["tokens_per_second"] for r in rows])
        drafted = sum(r[m]["drafted"] for r in rows)
        summary[m] = {"tokens_per_second": geo, "identical": all(r[m]["identical"] for r in rows),
                      "acceptance_rate": sum(r[m]["accepted"] for r in rows) / drafted if drafted else 0.0}
    if "none" in summary:
        for m in methods:
            summary[m]["speedup"] = summary[m]["tokens_per_second"] / summary["none"]["tokens_per_second"]
            for r in rows:
                r[m]["speedup"] = r[m]["tokens_per_second"] / r["none"]["tokens_per_second"]
    return {"bundle": bundle, "k": k, "repeats": repeats, "max_new_tokens": max_new_tokens, "prompts": rows,
            "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--methods", default="none,ngram,draft,hybrid")
    ap.add_argument("--k", default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", dest="out")
    args = ap.parse_args()
    k = args.k if args.k == "auto" else int(args.k)
    result = run(args.bundle, args.methods.split(","), k, args.repeats, args.max_new_tokens)
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
