"""Gemma 3 plain greedy decoding, interleaved in one run: specrt's fused ONNX Runtime graph (backend `ort`), its
portable graph (`ort-portable`), transformers (PyTorch fp32) and onnxruntime-genai (when its builder accepts the
checkpoint; the section says so when not), all on the same threads, prompts and token budget. Writes
benchmarks/gemma3.json and the Markdown section benchmarks/sections/gemma3.md.

    python scripts/gemma3_shape.py artifacts/gemma3-270m-shape      # a random model of Gemma 3 270M's shape
    specrt compile --target artifacts/gemma3-270m-shape -o artifacts/gemma3-270m-bundle --max-seq-len 1024
    python scripts/gemma3_bench.py artifacts/gemma3-270m-bundle artifacts/gemma3-270m-shape [--rounds 3]

Each round runs every prompt on every engine in turn (0.1 s untimed pause between engines: ONNX Runtime's pool
threads spin after a run); ratios are taken per round and prompt, then the median, so that load shared with
other work moves both sides of a ratio alike.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
import types
from pathlib import Path

import numpy as np

PROMPTS = ["def parse_args(argv):\n    parser = argparse.ArgumentParser(", "import os\nimport sys\n\n\ndef main(",
           "The history of the city begins"]
ENGINES = ("transformers", "specrt fused", "specrt portable", "onnxruntime-genai")


def _hf(checkpoint: Path, threads: int, tokens: int):
    import torch
    import transformers as tf

    tf.utils.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    model = tf.AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()

    def run(ids: list[int]) -> tuple[list[int], float]:
        x = torch.tensor([ids])
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=tokens, do_sample=False,
                                 pad_token_id=0)
            dt = time.perf_counter() - t0
        return out[0, len(ids):].tolist(), dt

    return run, f"transformers {tf.__version__}, torch {torch.__version__}, fp32, {torch.get_num_threads()} threads"


def _ours(bundle: Path, backend: str, threads: int, tokens: int, screen: bool = True):
    from specrt.runtime import load

    os.environ["SPECRT_LM_HEAD_SCREEN"] = "1" if screen else "0"  # read when the runner is created
    try:
        gen = load(bundle, backend=backend, threads=threads)
    finally:
        os.environ.pop("SPECRT_LM_HEAD_SCREEN")

    def run(ids: list[int]) -> tuple[list[int], float]:
        t0 = time.perf_counter()
        res = gen.generate(ids, tokens, method="none", temperature=0)
        return res.token_ids, time.perf_counter() - t0

    if "lm_head" in gen.target.describe() and screen:  # count the calls the screen decided (rows with -inf)
        gen.screen_calls = [0, 0]
        for name in ("_forward", "_forward_last"):
            setattr(gen.target, name, _counting(getattr(gen.target, name), gen.screen_calls))

    d = gen.target.describe()
    head = ", screened greedy LM head" if "lm_head" in d else ""
    if not screen:
        head = ", full LM head (SPECRT_LM_HEAD_SCREEN=0)"
    return run, gen, f"specrt {backend} ({d.get('graph') or 'portable'} graph{head}, {d.get('threads')} threads)"


def _counting(call, counts: list[int]):
    def counted(*args):
        out = call(*args)
        counts[0] += 1
        counts[1] += not np.isfinite(out).all()
        return out
    return counted


def _ortgenai(bundle_gen, checkpoint: Path, tokens: int):
    """(run, description) or (None, why not): its builder decides whether it takes the model."""
    try:
        from specrt.bench.peer_common import PLAIN
        from specrt.bench.peer_ortgenai import OrtGenaiPeer

        settings = types.SimpleNamespace(max_new_tokens=tokens, target_checkpoint=str(checkpoint),
                                         draft_checkpoint=None, methods=("none",), simulate=True, ks=[])
        peer = OrtGenaiPeer(bundle_gen, settings)
    except Exception as exc:  # ImportError, its builder's failure (PeerError quotes its last line)
        return None, f"not measured: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def run(ids: list[int]) -> tuple[list[int], float]:
        r = peer.generate(ids, PLAIN, max_new_tokens=tokens)
        return r.token_ids, r.seconds

    return run, peer.describe()["title"]


def measure(bundle: Path, checkpoint: Path, rounds: int, tokens: int, threads: int) -> dict:
    load_start = os.getloadavg()[0]
    fused, gen, fused_desc = _ours(bundle, "ort", threads, tokens)
    full_head = None
    if gen.target.describe().get("lm_head"):  # the same fused graph with its full head, for comparison
        full_head, _, full_desc = _ours(bundle, "ort", threads, tokens, screen=False)
    portable, _, portable_desc = _ours(bundle, "ort-portable", threads, tokens)
    hf, hf_desc = _hf(checkpoint, threads, tokens)
    og, og_desc = _ortgenai(gen, checkpoint, tokens)
    runs = {"transformers": hf, "specrt fused": fused, "specrt fused, full head": full_head,
            "specrt portable": portable}
    runs = {name: run for name, run in runs.items() if run is not None}
    if og is not None:
        runs["onnxruntime-genai"] = og
    prompt_ids = [gen.tokenizer.encode(p) for p in PROMPTS]
    for run in runs.values():  # warm-up, untimed
        run(prompt_ids[0][:4])
    if getattr(gen, "screen_calls", None):
        gen.screen_calls[:] = [0, 0]
    rates: dict[str, list[list[float]]] = {name: [] for name in runs}  # [round][prompt] tok/s
    outputs: dict[str, list[list[int]]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in runs:
            rates[name].append([])
        for ids in prompt_ids:
            for name, run in runs.items():
                time.sleep(0.1)
                out, dt = run(ids)
                rates[name][r].append(len(out) / dt)
                if r == 0:
                    outputs[name].append(out)
    ref = outputs["transformers"]
    table = {}
    for name in runs:
        per_round = [statistics.mean(x) for x in rates[name]]
        ratio = {other: statistics.median(a / b for ra, rb in zip(rates[name], rates[other]) for a, b in zip(ra, rb))
                 for other in ("transformers", "specrt portable")}
        table[name] = {"tokens_per_second": {"median": statistics.median(per_round), "min": min(per_round),
                                             "max": max(per_round)},
                       "ratio_over_transformers": ratio["transformers"],
                       "ratio_over_portable": ratio["specrt portable"],
                       "identical_to_transformers": sum(o == t for o, t in zip(outputs[name], ref)),
                       "prompts": len(ref)}
    from importlib import metadata

    c = gen.target.config
    from specrt.cli.describe import lm_head_share

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores visible, "
                       f"{platform.platform()}",
            "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
            "bundle": str(bundle), "checkpoint": str(checkpoint), "rounds": rounds, "new_tokens": tokens,
            "threads": threads, "prompts": PROMPTS, "onnxruntime": metadata.version("onnxruntime"),
            "engines": {"transformers": hf_desc, "specrt fused": fused_desc, "specrt portable": portable_desc,
                        "onnxruntime-genai": og_desc} | ({"specrt fused, full head": full_desc} if full_head else {}),
            "model": {"architecture": c.architecture, "hidden": c.hidden_size, "layers": c.num_layers,
                      "heads": c.num_heads, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
                      "vocab": c.vocab_size, "sliding_window": c.sliding_window,
                      "lm_head": lm_head_share(c)},
            "results": table,
            "screen_calls": getattr(gen, "screen_calls", None)}  # [calls, calls the screen decided] (timed runs)


def markdown(r: dict, command: str) -> str:
    m = r["model"]
    lines = [
        "## Gemma 3 270M's shape (random weights): fused vs portable graph, transformers, onnxruntime-genai",
        "",
        "- **Model**: a randomly initialised Gemma3ForCausalLM with Gemma 3 270M's exact configuration "
        f"(hidden {m['hidden']}, {m['layers']} layers, {m['heads']} heads / {m['kv_heads']} KV head, head_dim "
        f"{m['head_dim']}, vocab {m['vocab']:,}, sliding window {m['sliding_window']}, 5 local : 1 global), made by "
        "`scripts/gemma3_shape.py` and saved by transformers: **not the real checkpoint** (none is reachable offline "
        "here); speed depends on shapes, not on weight values (except how often the screened head below decides, "
        "which depends on how peaked the logits are: random weights give flat ones). The LM head is "
        f"{m['lm_head']['head_weights'] / 1e6:.1f}M of the {(m['lm_head']['head_weights'] + m['lm_head']['layer_weights']) / 1e6:.1f}M "
        f"weights a decode step reads ({100 * m['lm_head']['share']:.1f}%). The fused graph's screened head "
        "(compiler/lm_head_screen.py: int8 screen with an error bound, fp32 logits for 256 candidates, the full head "
        "when the bound cannot decide) gives the full head's greedy argmax; the row \"full head\" is the same graph "
        "with it switched off.",
        f"- **Machine**: {r['machine']}; load average (1 min) at start {r['load_average'][0]}, at end "
        f"{r['load_average'][1]} (shared with other work: ratios, taken per round and prompt, are the figures to "
        "read; absolute tok/s are not final)",
        f"- **Date**: {r['date']}; onnxruntime {r['onnxruntime']}",
        f"- **Command**: `{command}`",
        f"- **Settings**: plain greedy decoding, {r['new_tokens']} new tokens (end to end, prefill of a short prompt "
        f"included), {len(r['prompts'])} prompts, {r['rounds']} interleaved rounds (median [min-max] of the per-round "
        f"mean), {r['threads']} threads for every engine",
        "",
        "| engine | tok/s [min-max] | / transformers | / specrt portable | greedy = transformers |",
        "|---|---|---|---|---|",
    ]
    for name, row in r["results"].items():
        t = row["tokens_per_second"]
        lines.append(f"| {r['engines'][name]} | {t['median']:.1f} [{t['min']:.1f}-{t['max']:.1f}] | "
                     f"{row['ratio_over_transformers']:.2f}x | {row['ratio_over_portable']:.2f}x | "
                     f"{row['identical_to_transformers']}/{row['prompts']} |")
    if r.get("screen_calls"):
        calls, decided = r["screen_calls"]
        lines += ["", f"Screened head: the screen decided {decided} of the {calls} target calls of the timed runs "
                      "(the others computed the full head after it)."]
    if "onnxruntime-genai" not in r["results"]:
        lines += ["", f"onnxruntime-genai: {r['engines']['onnxruntime-genai']}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=Path("benchmarks/gemma3.json"))
    ap.add_argument("--markdown", type=Path, default=Path("benchmarks/sections/gemma3.md"))
    args = ap.parse_args()
    result = measure(args.bundle, args.checkpoint, args.rounds, args.tokens, args.threads)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    command = (f"python scripts/gemma3_bench.py {args.bundle} {args.checkpoint} --rounds {args.rounds} "
               f"--tokens {args.tokens} --threads {args.threads}")
    args.markdown.write_text(markdown(result, command))
    print(args.markdown.read_text())


if __name__ == "__main__":
    main()
