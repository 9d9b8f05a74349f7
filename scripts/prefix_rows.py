"""Which KV rows can a prefix cache reuse bit-exactly? (docs/batching.md, "Prefix cache"; issue #53)

    python scripts/prefix_rows.py BUNDLE [--tokens 600] [--answer 24]

On the bundle's target (fused ONNX Runtime graph, CPU) it prefills one prompt in several chunkings and compares
every KV row (keys and values, all layers) and the last row's logits with a single-pass prefill; then it compares
the rows that one-token decode steps and a several-row verify pass write (an answer's rows) with the rows a prefill
of the same tokens writes. Prints one line per case: max |diff| of the rows, whether they are bit-identical.
"""

from __future__ import annotations

import argparse

import numpy as np

from specrt.runtime import load


def rows(runner, n: int) -> np.ndarray:
    """The first n KV rows of every layer: [2L, Hkv, n, D] (a copy)."""
    c = runner.cache
    return np.stack([b[0, :, :n] for b in list(c.keys) + list(c.values)]).copy()


def prefill(runner, ids: np.ndarray, chunks: list[int]) -> np.ndarray:
    runner.reset()
    last, start = None, 0
    for size in chunks:
        last = runner.forward_last(ids[start:start + size])
        start += size
    assert start == ids.size
    return np.array(last, copy=True)


def report(name: str, a: np.ndarray, b: np.ndarray) -> None:
    d = float(np.max(np.abs(a - b))) if a.size else 0.0
    print(f"{name:58s} max|diff| {d:.3g}  bit-identical {np.array_equal(a, b)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--answer", type=int, default=24)
    args = ap.parse_args()
    gen = load(args.bundle, warmup=False)
    t = gen.target
    print(f"bundle {args.bundle}: min_rows {t.min_rows}, {t.describe()}")
    rng = np.random.default_rng(0)
    n = args.tokens
    ids = rng.integers(10, gen.vocab_size - 10, size=n).astype(np.int64)
    ref_last = prefill(t, ids, [n])
    ref = rows(t, n)
    # the no-cache chunkings the scheduler makes (256 a step, or a shared budget) and the cache's (16-token blocks)
    for chunks in ([256, 256, n - 512], [300, n - 300], [100] * (n // 100), [496, n - 496], [592, n - 592],
                   [255, 1, n - 256], [n - 1, 1], [16] * (n // 16) + [n % 16] if n % 16 else [16] * (n // 16)):
        chunks = [c for c in chunks if c]
        last = prefill(t, ids, chunks)
        label = "+".join(map(str, chunks)) if len(chunks) <= 5 else f"{len(chunks)} chunks of {chunks[0]}"
        report(f"prefill {label}: KV rows", rows(t, n), ref)
        report(f"prefill {label}: last logits", last, ref_last)
    # an answer's rows: one-token decode steps, and a 5-row verify pass, against a prefill of the same tokens
    a = args.answer
    prefill(t, ids, [256, 256, n - 512])
    out = []
    tok = int(np.argmax(ref_last))
    for _ in range(a):
        out.append(tok)
        tok = int(np.argmax(t.forward(np.array([tok], np.int64))[-1]))
    decoded = rows(t, n + a)[:, :, n:]
    full = np.concatenate([ids, np.array(out, np.int64)])
    prefill(t, full, [256, 256, n + a - 512])
    prefilled = rows(t, n + a)[:, :, n:]
    report(f"answer rows: {a} one-token decodes vs prefill", decoded, prefilled)
    prefill(t, ids, [256, 256, n - 512])
    for start in range(0, a - a % 5, 5):
        t.forward(np.array(out[start:start + 5], np.int64))
    m = a - a % 5
    report(f"answer rows: {m // 5} verify passes of 5 rows vs prefill", rows(t, n + m)[:, :, n:], prefilled[:, :, :m])


if __name__ == "__main__":
    main()
