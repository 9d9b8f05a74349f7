"""Prefix cache goal measurements (issue #53; docs/batching.md "Prefix cache"), on one batch engine whose prefix cache
is switched on and off between runs (same sessions, same threads; the runs interleaved, the order alternating):

1. multi-turn TTFT: a chat whose first turn carries ~--history tokens (a long system message: a document), answered
   (--answer tokens, greedy), then a second question. The second turn's time to first token with the cache (the first
   turn's prompt rows reused) and without; its whole answer must be identical.
2. throughput with --clients clients at once, no shared prefixes (every prompt distinct from its first block on):
   tokens per second with the cache on (rows stored at every prefill, never hit) and off.

    python scripts/prefix_bench.py BUNDLE [--history 600] [--rounds 3] [--clients 8] [--method ngram]
                                   [--json FILE] [--markdown FILE --label LABEL]   (scripts/make_benchmarks.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

DOC = Path(__file__).resolve().parents[1] / "docs" / "batching.md"


def first_token_time(engine, ids, max_new, method):
    """(seconds from submission to the first token, every token, prompt tokens taken from the cache)."""
    from specrt.runtime.batch.streams import END

    t0 = time.perf_counter()
    seq, events = engine.submit(ids, max_new_tokens=max_new, method=method, temperature=0)
    ttft, out = None, []
    while True:
        ev = events.get(timeout=600)
        if ev is END:
            return ttft, out, seq.stats.cached_tokens
        if isinstance(ev, BaseException):
            raise ev
        ttft = ev[0] - t0 if ttft is None else ttft
        out.extend(ev[1])


def chat_ids(gen, fmt, messages):
    text, special = fmt.render(messages)
    return gen.tokenizer.encode(text, add_special_tokens=special)


def document(gen, tokens: int, tag: str) -> str:
    words = DOC.read_text(encoding="utf-8").split()
    text, n = tag, 0
    while len(gen.tokenizer.encode(text, add_special_tokens=False)) < tokens and n < len(words):
        text += " " + " ".join(words[n:n + 40])
        n += 40
    return text


def ttft_rounds(gen, engine, args, fmt):
    rows = []
    for r in range(args.rounds):
        system = document(gen, args.history, f"Session {r}. Read this document, then answer questions about it.")
        q1, q2 = "What does one step of the scheduler do?", "And what happens to a request that ends early?"
        first = chat_ids(gen, fmt, [{"role": "system", "content": system}, {"role": "user", "content": q1}])
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {}
        for cache in order:
            engine.scheduler.prefix.enabled = cache
            _, answer, _ = first_token_time(engine, first, args.answer, args.method)
            reply = gen.tokenizer.decode(answer, skip_special_tokens=True)
            second = chat_ids(gen, fmt, [{"role": "system", "content": system}, {"role": "user", "content": q1},
                                         {"role": "assistant", "content": reply}, {"role": "user", "content": q2}])
            got[cache] = (len(first), len(second)) + first_token_time(engine, second, args.answer, args.method)
        (n1, n2, on, out_on, cached), (_, _, off, out_off, _) = got[True], got[False]
        rows.append((on, off, out_on == out_off))
        print(f"round {r}: turn-1 prompt {n1}, turn-2 prompt {n2} tokens ({cached} from the cache); turn-2 TTFT "
              f"cache {on * 1e3:.0f} ms, no cache {off * 1e3:.0f} ms, ratio {on / off:.2f}; identical {out_on == out_off}")
    on, off = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
    print(f"TTFT median: cache {on * 1e3:.0f} ms, no cache {off * 1e3:.0f} ms, ratio {on / off:.2f}; "
          f"all identical {all(r[2] for r in rows)}")
    return {"rounds": args.rounds, "turn1_tokens": n1, "turn2_tokens": n2, "cached_tokens": cached,
            "ttft_cache_ms": on * 1e3, "ttft_no_cache_ms": off * 1e3, "ratio": on / off,
            "ratios": [r[0] / r[1] for r in rows], "identical": all(r[2] for r in rows)}


def timed_hooks(prefix) -> dict:
    """Wrap the prefix cache's hooks so that the seconds spent in them are counted (the cache's whole cost)."""
    spent = {"s": 0.0}
    for name in ("on_admit", "on_chunk", "on_prefilled", "on_finish"):
        hook = getattr(prefix, name)

        def timed(*a, _hook=hook):
            t0 = time.perf_counter()
            try:
                return _hook(*a)
            finally:
                spent["s"] += time.perf_counter() - t0
        setattr(prefix, name, timed)
    return spent


def throughput_rounds(gen, engine, args):
    rng = np.random.default_rng(0)
    tps = {True: [], False: []}
    spent, walls = timed_hooks(engine.scheduler.prefix), 0.0
    engine.generate_batch([rng.integers(100, gen.vocab_size - 100, args.prompt_tokens).tolist()
                           for _ in range(args.clients)], 8, method=args.method, temperature=0)  # warm-up, untimed
    spent["s"] = 0.0
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for cache in order:
            engine.scheduler.prefix.enabled = cache
            # distinct from the first token on: no prefix is shared with anything stored
            prompts = [rng.integers(100, gen.vocab_size - 100, args.prompt_tokens).tolist() for _ in range(args.clients)]
            t0 = time.perf_counter()
            results = engine.generate_batch(prompts, args.max_new, method=args.method, temperature=0)
            wall = time.perf_counter() - t0
            walls += wall if cache else 0.0
            tps[cache].append(sum(len(x.token_ids) for x in results) / wall)
        print(f"round {r}: {args.clients} clients, tok/s cache {tps[True][-1]:.1f}, no cache {tps[False][-1]:.1f}")
    on, off = statistics.median(tps[True]), statistics.median(tps[False])
    print(f"throughput median: cache {on:.1f} tok/s, no cache {off:.1f} tok/s, ratio {on / off:.3f}; time in the "
          f"prefix cache's hooks {spent['s']:.2f} s of {walls:.1f} s with the cache ({spent['s'] / walls:.2%}); store "
          f"{engine.scheduler.prefix.describe()}")
    return {"rounds": args.rounds, "clients": args.clients, "tps_cache": on, "tps_no_cache": off, "ratio": on / off,
            "hooks_share": spent["s"] / walls}


def markdown(args, ttft: dict | None, tput: dict | None) -> str:
    """The BENCHMARKS.md section of this run (scripts/make_benchmarks.sh, SECTIONS=prefix-cache)."""
    load = os.getloadavg()[0]
    out = [f"### {args.label}", "",
           f"`python scripts/prefix_bench.py {args.bundle} --rounds {args.rounds} --history {args.history} "
           f"--method {args.method}` ({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {os.cpu_count()} cores, "
           f"{platform.processor() or platform.machine()}, load average at the end {load:.2f}); one engine, the cache "
           "switched on and off between runs, interleaved, the order alternating; medians over the rounds.", ""]
    if ttft is not None:
        out += ["| multi-turn chat | turn-2 prompt | from the cache | TTFT with the cache | without | ratio | "
                "per round | text |", "|---|---|---|---|---|---|---|---|",
                f"| turn 1 ~{args.history} tokens of history, answered in {args.answer} | {ttft['turn2_tokens']} | "
                f"{ttft['cached_tokens']} | {ttft['ttft_cache_ms']:,.0f} ms | {ttft['ttft_no_cache_ms']:,.0f} ms | "
                f"{ttft['ratio']:.2f} | {', '.join(f'{r:.2f}' for r in ttft['ratios'])} | "
                f"{'identical' if ttft['identical'] else 'DIFFERENT'} |", ""]
    if tput is not None:
        out += ["| throughput, no shared prefixes | with the cache | without | ratio | hooks' share of the time |",
                "|---|---|---|---|---|",
                f"| {tput['clients']} clients, {args.prompt_tokens} prompt + {args.max_new} new tokens, {args.method} | "
                f"{tput['tps_cache']:.1f} tok/s | {tput['tps_no_cache']:.1f} tok/s | {tput['ratio']:.2f} | "
                f"{tput['hooks_share']:.2%} |", ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--history", type=int, default=600)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--method", default="ngram")
    ap.add_argument("--skip", choices=["ttft", "throughput"], default=None)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--markdown", help="write a BENCHMARKS.md section here")
    ap.add_argument("--label", default="Prefix cache", help="the section's title")
    args = ap.parse_args()
    from specrt.runtime import load
    from specrt.runtime.backends.ort.threads import share_thread_pool
    from specrt.runtime.chat_template import ChatFormatter

    share_thread_pool(None)  # as `specrt serve`: the engine's sessions on one pool
    gen = load(args.bundle, backend="ort")
    engine = gen.engine(max_batch=args.clients)
    ttft = tput = None
    try:
        if args.skip != "ttft":
            ttft = ttft_rounds(gen, engine, args, ChatFormatter.from_manifest(gen.manifest))
        if args.skip != "throughput":
            tput = throughput_rounds(gen, engine, args)
    finally:
        engine.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"bundle": args.bundle, "ttft": ttft, "throughput": tput}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(args, ttft, tput), encoding="utf-8")


if __name__ == "__main__":
    main()
