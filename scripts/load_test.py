#!/usr/bin/env python
"""Bounded load test for `specrt serve` (or any OpenAI-compatible server): requests/s and latency percentiles.

    python scripts/load_test.py --url http://127.0.0.1:8000 --concurrency 1,4,16,32 --requests 64 \
        --max-tokens 32 --stream

For each concurrency level C, it sends exactly --requests requests with C in flight at a time and
reports requests/s, output tokens/s, latency p50/p90/p99 and (with --stream) time to first token.
It talks only to --url. Rejected requests (429 and others) are counted, never retried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from typing import Any, Optional

import httpx


def percentile(values: list[float], q: float) -> Optional[float]:
    """Nearest-rank percentile; None when there are no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


async def one_request(client: httpx.AsyncClient, args: argparse.Namespace, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": args.prompt}]
    else:
        path, body["prompt"] = "/v1/completions", args.prompt
    if args.k is not None or args.method:
        body["speculative"] = {k: v for k, v in (("method", args.method), ("num_speculative_tokens", args.k)) if v}
    start = time.perf_counter()
    ttft, tokens = None, 0
    try:
        if not args.stream:
            resp = await client.post(path, json=body)
            if resp.status_code != 200:
                return {"status": resp.status_code}
            tokens = resp.json().get("usage", {}).get("completion_tokens", 0)
        else:
            body.update(stream=True, stream_options={"include_usage": True})
            async with client.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    return {"status": resp.status_code}
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return {"status": "stream_error"}
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    choice = (chunk.get("choices") or [{}])[0]
                    if ttft is None and (choice.get("text") or (choice.get("delta") or {}).get("content")):
                        ttft = time.perf_counter() - start
    except httpx.HTTPError as exc:
        return {"status": type(exc).__name__}
    return {"status": 200, "latency": time.perf_counter() - start, "ttft": ttft, "tokens": tokens}


async def run_level(args: argparse.Namespace, model: str, concurrency: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    results: list[dict[str, Any]] = []
    remaining = args.requests

    async with httpx.AsyncClient(base_url=args.url, headers=auth_headers(args), timeout=args.timeout,
                                 limits=limits) as client:
        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                results.append(await one_request(client, args, model))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    ok = [r for r in results if r["status"] == 200]
    errors: dict[str, int] = {}
    for r in results:
        if r["status"] != 200:
            errors[str(r["status"])] = errors.get(str(r["status"]), 0) + 1
    lat = [r["latency"] for r in ok]
    ttft = [r["ttft"] for r in ok if r.get("ttft") is not None]
    row = {"concurrency": concurrency, "requests": len(results), "ok": len(ok), "errors": errors,
           "elapsed_s": elapsed, "requests_per_s": len(ok) / elapsed if elapsed > 0 else 0.0,
           "output_tokens_per_s": sum(r["tokens"] for r in ok) / elapsed if elapsed > 0 else 0.0}
    for q in (50, 90, 99):
        row[f"latency_p{q}_s"] = percentile(lat, q)
        if args.stream:
            row[f"ttft_p{q}_s"] = percentile(ttft, q)
    return row


def auth_headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def served_model(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    resp = httpx.get(f"{args.url}/v1/models", headers=auth_headers(args), timeout=args.timeout)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def print_table(rows: list[dict[str, Any]], stream: bool) -> None:
    ms = lambda v: "-" if v is None else f"{v * 1000:.1f}"  # noqa: E731
    cols = ["conc", "ok/sent", "req/s", "tok/s", "p50 ms", "p90 ms", "p99 ms"]
    cols += ["ttft p50", "ttft p90", "ttft p99"] if stream else []
    cols.append("errors")
    lines = []
    for r in rows:
        cells = [str(r["concurrency"]), f"{r['ok']}/{r['requests']}", f"{r['requests_per_s']:.2f}",
                 f"{r['output_tokens_per_s']:.1f}"] + [ms(r[f"latency_p{q}_s"]) for q in (50, 90, 99)]
        if stream:
            cells += [ms(r[f"ttft_p{q}_s"]) for q in (50, 90, 99)]
        cells.append(", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "-")
        lines.append(cells)
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for line in lines:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    p.add_argument("--concurrency", default="1,4,16,32", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=64, help="requests per level")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt", default="def fibonacci(n):\n    ")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    p.add_argument("--stream", action="store_true", help="stream (also measures time to first token)")
    p.add_argument("--method", default=None, help="speculative method per request (extra body field)")
    p.add_argument("--num-speculative-tokens", dest="k", default=None, help="k per request, or 'auto'")
    p.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    args.url = args.url.rstrip("/").removesuffix("/v1")
    try:
        args.levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        p.error(f"--concurrency must be comma-separated integers, got {args.concurrency!r}")
    if not args.levels or min(args.levels) < 1 or args.requests < 1 or args.max_tokens < 1:
        p.error("--concurrency levels, --requests and --max-tokens must be >= 1")
    if args.k is not None and args.k != "auto":
        args.k = int(args.k)
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        model = served_model(args)
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        print(f"error: cannot reach {args.url}/v1/models: {exc}", file=sys.stderr)
        return 1
    rows = [asyncio.run(run_level(args, model, c)) for c in args.levels]
    if args.json:
        print(json.dumps({"url": args.url, "model": model, "stream": args.stream, "max_tokens": args.max_tokens,
                          "levels": rows}, indent=2))
    else:
        print(f"{args.url} model={model} max_tokens={args.max_tokens} stream={args.stream} "
              f"requests/level={args.requests}")
        print_table(rows, args.stream)
    return 0 if all(r["ok"] == r["requests"] for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
