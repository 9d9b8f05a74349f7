"""Plain and speculative decoding speed of quantized SmolLM2 bundles, interleaved (one-off measurement, issue 14).

    python scripts/quant_speed.py --fp32 B_FP32 --int4-l4 B_L4 [--int4-l1 B_L1] [--genai DIR] --out results.json

Configurations (each a Generator on the CPU runner named; every round runs every configuration on every prompt,
so load drifts on a shared machine hit them alike):
  fp32 fused; int4 level 1 portable / fused; int4 level 4 fused with two-row decode (the batch-invariant default)
  and with one-row decode (--quant-fast-decode: the same files, the runner's min_rows set to 1); n-gram (k=4) on
  the level-4 ones; onnxruntime-genai's int4 model when --genai is given (same prompt ids, greedy).
Reported per configuration: median tok/s over rounds (new tokens / wall seconds of the whole generate call) and,
for speculative configurations, whether the tokens equal plain decoding of the same compiled target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from specrt.runtime import load

PROMPTS = ["Write a short story about a robot learning to paint.", "def fibonacci(n):",
           "Explain how a hash map works.", "List five uses of a paperclip:",
           "The quick brown fox jumps over the lazy dog. The quick brown fox"]


def derive_level1(bundle: Path, out: Path) -> Path:
    """A copy of a level-4 int4 bundle whose quantized graphs compute at level 1 (same weights file: only the
    MatMulNBits attribute, the manifest's level / min_rows and the rewritten files' checksums change). Its quality
    and consistency records stay those of level 4: a measurement copy, not a bundle to ship."""
    import hashlib
    import shutil

    from specrt.compiler.quantize_fused import with_accuracy_level

    if out.exists():
        return out
    shutil.copytree(bundle, out, copy_function=os.link)
    manifest = json.loads((out / "manifest.json").read_text())
    q = manifest["models"]["target"]["quantization"]
    for graph in q["graphs"].values():
        path = out / graph["onnx"]
        tmp = path.with_name("." + path.name)
        with_accuracy_level(path, tmp, 1)
        path.unlink()  # a hard link to the level-4 bundle's file
        tmp.rename(path)
        data = path.read_bytes()
        manifest["files"][graph["onnx"]] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    q.update(accuracy_level=1, min_rows=1, batch_invariant_setting=True)
    (out / "manifest.json").unlink()  # a hard link to the level-4 bundle's manifest: never write through it
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def genai_runner(path: Path, threads: int):
    import onnxruntime_genai as og

    config = og.Config(str(path))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    model = og.Model(config)

    def run(ids: list[int], budget: int) -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + budget)
        gen = og.Generator(model, params)
        gen.append_tokens([ids])
        while not gen.is_done():
            gen.generate_next_token()
        return [int(t) for t in gen.get_sequence(0)][len(ids):]

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp32", type=Path, required=True)
    ap.add_argument("--int4-l1", type=Path, help="default: derived from --int4-l4 (derive_level1)")
    ap.add_argument("--int4-l4", type=Path, required=True)
    ap.add_argument("--genai", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    t = args.threads
    if args.int4_l1 is None:
        args.int4_l1 = derive_level1(args.int4_l4, args.int4_l4.with_name(args.int4_l4.name + "-as-level1"))
    gens = {"fp32 fused": load(args.fp32, backend="ort", threads=t),
            "int4 L1 portable": load(args.int4_l1, backend="ort-portable", threads=t),
            "int4 L1 fused": load(args.int4_l1, backend="ort", threads=t),
            "int4 L4 fused 2-row": load(args.int4_l4, backend="ort", threads=t),
            "int4 L4 fused 1-row": load(args.int4_l4, backend="ort", threads=t)}
    gens["int4 L4 fused 1-row"].target.min_rows = 1  # what --quant-fast-decode records in the manifest
    assert gens["int4 L4 fused 2-row"].target.min_rows == 2
    configs = [(name, "none") for name in gens] + [("int4 L4 fused 2-row", "ngram"), ("int4 L4 fused 1-row", "ngram"),
                                                   ("int4 L1 fused", "ngram")]
    tok = gens["fp32 fused"].tokenizer
    prompt_ids = [list(tok.encode(p)) for p in PROMPTS[:args.prompts]]
    genai = genai_runner(args.genai, t) if args.genai else None
    speed: dict[str, list[float]] = {}
    outputs: dict[str, list] = {}
    for _ in range(args.rounds):
        for name, method in configs:
            key = f"{name} {method}"
            tokens = seconds = 0.0
            outs = []
            for ids in prompt_ids:
                t0 = time.perf_counter()
                res = gens[name].generate(ids, args.tokens, method=method, num_speculative_tokens=4)
                seconds += time.perf_counter() - t0
                tokens += len(res.token_ids)
                outs.append(res.token_ids)
            speed.setdefault(key, []).append(tokens / seconds)
            outputs[key] = outs
        if genai:
            tokens = seconds = 0.0
            outs = []
            for ids in prompt_ids:
                t0 = time.perf_counter()
                out = genai(ids, args.tokens)
                seconds += time.perf_counter() - t0
                tokens += len(out)
                outs.append(out)
            speed.setdefault("ort-genai int4 none", []).append(tokens / seconds)
            outputs["ort-genai int4 none"] = outs
    report = {}
    for key, values in speed.items():
        name, method = key.rsplit(" ", 1)
        row = {"tok_s_median": statistics.median(values), "tok_s": values}
        if method != "none":
            row["identical_to_plain"] = outputs[key] == outputs[f"{name} none"]
        report[key] = row
        print(f"{key:32s} {row['tok_s_median']:7.1f} tok/s  {['%.1f' % v for v in values]}"
              + (f"  identical to plain: {row['identical_to_plain']}" if "identical_to_plain" in row else ""), flush=True)
    report["conditions"] = {"prompts": len(prompt_ids), "max_new_tokens": args.tokens, "rounds": args.rounds,
                            "threads": t, "k": 4, "note": "2 cores shared with 3 other engineers' jobs"}
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
