"""`specrt bench BUNDLE --concurrency 1,2,4,8`: many clients at once on the batching scheduler.

The same P prompts (every prompt given, cycled to at least the largest N), greedy, `max_new_tokens` each, are answered for
each concurrency N
* one at a time by the Generator with the method given (what a one-slot server does, speculation included: the
  baseline "sequential"; so at N = 1 "plain batched" is plain decoding against speculative decoding),
* by N closed-loop clients on one `BatchEngine` (each sends its next prompt when its answer is complete, so at most
  N requests run at once) without speculation ("plain batched", method none),
* the same with speculation chosen per request and step ("speculative batched", the method given),
* optionally by onnxruntime-genai generating them in batches of N (`--peer ort-genai`, static batching).
Rows are interleaved per N (the machine may be shared: compare ratios within a run), after one untimed request
through every configuration (`warm_up`: one-off start-up costs are not in the first row). Reported: aggregate tokens/s,
p50 / p95 request latency, time to first token and inter-token latency (per request, then p50 over requests), and
whether every request's tokens equal its sequential output.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

CHAT_PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is in two sentences.",
    "List three uses of the ONNX format.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Summarise: The quick brown fox jumps over the lazy dog. The dog sleeps. The fox runs away into the forest.",
    "What is the capital of France? Answer in one word, then explain why it is the capital.",
    "import numpy as np\n\ndef softmax(x):\n",
    "Translate to French: Good morning, how are you today?",
]


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _row(label: str, n: int, outputs: list[list[int]], wall: float, latencies: list[float], ttfts: list[float],
         itls: list[float], reference: list[list[int]] | None) -> dict[str, Any]:
    tokens = sum(len(o) for o in outputs)
    return {"config": label, "concurrency": n, "tokens": tokens, "seconds": wall,
            "tokens_per_second": tokens / wall if wall else 0.0,
            "latency_p50_s": _percentile(latencies, 50), "latency_p95_s": _percentile(latencies, 95),
            "ttft_p50_s": _percentile(ttfts, 50), "itl_p50_s": _percentile(itls, 50),
            "identical": None if reference is None else outputs == reference}


def _sequential(gen, prompts: list[list[int]], max_new: int, method: str) -> dict[str, Any]:
    outs, lat, ttft, itl = [], [], [], []
    t_all = time.perf_counter()
    for p in prompts:
        t0 = time.perf_counter()
        ids, first, last = [], None, None
        for chunk, _ in gen.stream_tokens(p, max_new, method=method, temperature=0):
            now = time.perf_counter()
            first = first or now
            ids.extend(chunk)
            last = now
        outs.append(ids)
        lat.append(last - t0)
        ttft.append(first - t0)
        itl.append((last - first) / max(len(ids) - 1, 1))
    return {"outs": outs, "wall": time.perf_counter() - t_all, "lat": lat, "ttft": ttft, "itl": itl}


def _drain(engine, seq, events) -> tuple[list[int], float | None, float | None]:
    """A submitted request's tokens, and when its first and last steps emitted them."""
    ids, first, last = [], None, None
    for now, chunk in engine.events(seq, events):
        first = first or now
        last = now
        ids.extend(chunk)
    return ids, first, last


def _batched(engine, prompts: list[list[int]], max_new: int, method: str, clients: int | None = None
             ) -> dict[str, Any]:
    """`clients` closed-loop clients (default: one per prompt): each submits the next prompt as soon as its
    previous answer is complete, so at most `clients` requests are in the engine at once."""
    import threading

    n = clients or len(prompts)
    results: list[Any] = [None] * len(prompts)
    errors: list[BaseException] = []
    order = iter(range(len(prompts)))
    lock = threading.Lock()

    def client() -> None:
        try:
            while True:
                with lock:
                    i = next(order, None)
                if i is None:
                    return
                t0 = time.perf_counter()
                seq, events = engine.submit(prompts[i], max_new_tokens=max_new, method=method, temperature=0)
                ids, first, last = _drain(engine, seq, events)
                first, last = first or t0, last or t0
                results[i] = (ids, last - t0, first - t0, (last - first) / max(len(ids) - 1, 1))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    t_all = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(n, len(prompts)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_all
    if errors:
        raise errors[0]
    return {"outs": [r[0] for r in results], "wall": wall, "lat": [r[1] for r in results],
            "ttft": [r[2] for r in results], "itl": [r[3] for r in results]}


def ortgenai_batch(model, og, prompts: list[list[int]], max_new: int, pad: int,
                   eos_ids: frozenset[int] = frozenset()) -> dict[str, Any]:
    """onnxruntime-genai: the prompts as one batch (left-padded with `pad`), greedy, until all finish. A row's
    tokens are counted up to its first EOS (inclusive), as ours are: what the batch decodes after a row ended is
    padding, not output."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad, dtype=np.int32)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = p
    t0 = time.perf_counter()
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=width + max_new, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    first = None
    while not generator.is_done():
        generator.generate_next_token()
        first = first or time.perf_counter()
    wall = time.perf_counter() - t0
    outs = [_until_eos([int(t) for t in generator.get_sequence(i)][width:], eos_ids) for i in range(len(prompts))]
    return {"outs": outs, "wall": wall, "lat": [wall] * len(prompts), "ttft": [(first or t0) - t0] * len(prompts),
            "itl": [(wall - ((first or t0) - t0)) / max(max_new - 1, 1)] * len(prompts)}


def _until_eos(ids: list[int], eos_ids: frozenset[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos_ids:
            return ids[:i + 1]
    return ids


def _waves(model, og, prompts, max_new, pad, eos_ids, n) -> dict[str, Any]:
    """onnxruntime-genai (static batching): the prompts in batches of n, one after the other."""
    out: dict[str, Any] = {"outs": [], "wall": 0.0, "lat": [], "ttft": [], "itl": []}
    for i in range(0, len(prompts), n):
        r = ortgenai_batch(model, og, prompts[i:i + n], max_new, pad, eos_ids)
        out["lat"] += r["lat"]  # from its batch's start: when its client sent it
        out["ttft"] += r["ttft"]
        out["wall"] += r["wall"]
        out["outs"] += r["outs"]
        out["itl"] += r["itl"]
    return out


def _rate(run: dict[str, Any]) -> float:
    return sum(len(o) for o in run["outs"]) / run["wall"] if run["wall"] else 0.0


def _paired(runs: list[dict[str, Any]], base: list[dict[str, Any]]) -> float:
    """The median over rounds of this configuration's tokens/s over `base`'s in the same round: the rounds are
    interleaved, so a machine that speeds up or slows down between rounds (a shared host) moves both alike."""
    return float(np.median([_rate(r) / _rate(b) for r, b in zip(runs, base) if _rate(b) > 0]))


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median wall time (its latencies belong to it)."""
    return sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]


def warm_up(gen, engine, prompts: list[list[int]], max_new: int, method: str, peer=None) -> None:
    """One untimed request through every configuration before the timed rows: one-off start-up costs (the timing
    of verify shapes on a first adaptive call, sessions created on first use, first runs of each graph shape) stay
    out of the first row (they made one client's sequential p95 37.6 s, and "plain batched" 4.5x sequential)."""
    first = prompts[:1]
    _sequential(gen, first, max_new, method)
    for m in ("none", method):
        _batched(engine, first, max_new, m, 1)
    if peer is not None:
        og, model, pad = peer
        _waves(model, og, first, max_new, pad, frozenset(gen.eos_ids), 1)


def run_concurrency(gen, levels: list[int], max_new_tokens: int, method: str, peer=None,
                    prompts: list[str] | None = None, progress=None, repeats: int = 1) -> dict[str, Any]:
    """Every row of the table (see the module docstring); `peer`: (og module, og.Model, pad id) or None.
    `prompts`: texts (default CHAT_PROMPTS), all of them answered at every level (cycled to the largest N). `repeats` rounds per level, the configurations
    interleaved within each round (A B C D A B C D ...); each row is the round with the median wall time."""
    from specrt.runtime.batch.engine import BatchEngine

    from specrt.bench.runner import fit_prompts
    from specrt.bench.suites import Prompt

    texts = prompts or CHAT_PROMPTS
    fitted = [ids.tolist() for ids in fit_prompts(gen, [Prompt("custom", t) for t in texts], max_new_tokens)[0]]
    # the prefix cache off: every round repeats the same prompts, which it would turn into hits after the first (the
    # sequential baseline prefills in full); it is measured apart, on fresh prompts: scripts/prefix_bench.py
    engine = BatchEngine(gen, max_batch=max(levels), prefix_cache_mb=0)
    rows = []
    try:
        ps = [fitted[i % len(fitted)] for i in range(max(len(fitted), max(levels)))]  # the same prompts at every level
        warm_up(gen, engine, ps, max_new_tokens, method, peer)
        for n in levels:
            if progress:
                progress(f"concurrency {n}", len(levels))
            runs: dict[str, list[dict[str, Any]]] = {"seq": [], "plain": [], "spec": [], "peer": []}
            for _ in range(max(repeats, 1)):
                runs["seq"].append(_sequential(gen, ps, max_new_tokens, method))
                runs["plain"].append(_batched(engine, ps, max_new_tokens, "none", n))
                runs["spec"].append(_batched(engine, ps, max_new_tokens, method, n))
                if peer is not None:
                    og, model, pad = peer
                    time.sleep(0.1)  # the other engine's spinning pool threads settle (see DESIGN.md)
                    runs["peer"].append(_waves(model, og, ps, max_new_tokens, pad, frozenset(gen.eos_ids), n))
                    time.sleep(0.1)
            seq = _median_run(runs["seq"])
            rows.append({**_row("sequential (one at a time)", n, seq["outs"], seq["wall"], seq["lat"], seq["ttft"],
                                seq["itl"], None), "vs_sequential": 1.0})
            for key, label in (("plain", "plain batched"), ("spec", f"speculative batched ({method})"),
                               ("peer", "onnxruntime-genai batch")):
                if not runs[key]:
                    continue
                r = _median_run(runs[key])
                # identical: every round's tokens equal the sequential output (the peer: its own decoding, compared)
                same = all(x["outs"] == seq["outs"] for x in runs[key])
                rows.append({**_row(label, n, r["outs"], r["wall"], r["lat"], r["ttft"], r["itl"], seq["outs"]),
                             "identical": same, "rounds": len(runs[key]),
                             "vs_sequential": _paired(runs[key], runs["seq"]),
                             "vs_plain": _paired(runs[key], runs["plain"])})
    finally:
        engine.close()
    return {"rows": rows, "max_new_tokens": max_new_tokens, "method": method, "repeats": max(repeats, 1),
            "prompts": len(texts), "costs": {"batch_s": engine.scheduler.costs.batch,
                                             "rows_s": engine.scheduler.costs.rows},
            "kv_bytes_per_slot": engine.scheduler.targets.kv_bytes_per_slot()}


def concurrency_markdown(result: dict[str, Any], title: str) -> str:
    lines = [f"## {title}", "",
             f"Greedy, {result['max_new_tokens']} new tokens per request, speculation method "
             f"`{result['method']}` with k chosen per request and step (goodput), {result.get('prompts', len(CHAT_PROMPTS))} "
             f"prompts (cycled to the largest N when fewer), answered by N closed-loop clients (each sends its next prompt when its answer is complete; onnxruntime-genai: batches of N). Per concurrency, {result.get('repeats', 1)} round(s) with the "
             "configurations interleaved; each row is its median round, and its ratios are the median over rounds "
             "of the ratio within each round (a shared machine's speed drifts between rounds). `identical`: every request's tokens equal "
             "its one-at-a-time output (onnxruntime-genai: its own batched decoding compared with ours alone; "
             "its tokens after a row's EOS are not counted). `vs sequential`: against the same prompts answered one "
             f"at a time by the Generator with `{result['method']}` (speculating, as a one-slot server does).", "",
             "| concurrency | configuration | tok/s (all) | vs sequential | vs plain batched | p50 latency s | "
             "p95 latency s | TTFT p50 s | ITL p50 ms | identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    base, plain = {}, {}
    for r in result["rows"]:
        if r["config"].startswith("sequential"):
            base[r["concurrency"]] = r["tokens_per_second"]
        if r["config"] == "plain batched":
            plain[r["concurrency"]] = r["tokens_per_second"]
        ratio = r.get("vs_sequential") or (r["tokens_per_second"] / base[r["concurrency"]]
                                           if base.get(r["concurrency"]) else 0.0)
        vs_plain = "" if r["config"].startswith("sequential") else (
            f"{r['vs_plain']:.2f}x" if "vs_plain" in r else
            f"{r['tokens_per_second'] / plain[r['concurrency']]:.2f}x" if plain.get(r["concurrency"]) else "")
        ident = "" if r["identical"] is None else ("yes" if r["identical"] else "NO")
        lines.append(f"| {r['concurrency']} | {r['config']} | {r['tokens_per_second']:.1f} | {ratio:.2f}x | {vs_plain} | "
                     f"{r['latency_p50_s']:.2f} | {r['latency_p95_s']:.2f} | {r['ttft_p50_s']:.3f} | "
                     f"{1000 * r['itl_p50_s']:.1f} | {ident} |")
    costs = result["costs"]["batch_s"]
    lines += ["", "Measured cost of one batched decode pass by batch size (ms): "
              + ", ".join(f"{b + 1}: {1000 * c:.2f}" for b, c in enumerate(costs))
              + f". KV per slot: {result['kv_bytes_per_slot'] / 2**20:.1f} MiB (preallocated, target)."]
    return "\n".join(lines)
