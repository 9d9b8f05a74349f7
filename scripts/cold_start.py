"""Cold start, side by side: `specrt generate BUNDLE --max-new-tokens 1` against a Python process that loads
onnxruntime-genai's model of the same checkpoint and generates one token, each timed from process start to
exit, alternated (A B A B ...) so that machine load hits both alike.

    python scripts/cold_start.py --bundle artifacts/smol-int4 [--genai-dir DIR] [--rounds 5]
        [--json benchmarks/cold_start.json] [--markdown benchmarks/sections/cold_start.md]

Without --genai-dir the peer model is built (and cached) the way `specrt bench --peer ort-genai` builds it:
from the checkpoint the bundle records (the SmolLM2 GGUF of the demo), at the bundle's precision (int4 for an
int4 target, else fp32). Both runs use the same prompt tokens, greedy, on all cores. Python's bytecode cache is
on for both (PYTHONDONTWRITEBYTECODE is dropped from their environment), as in an installed package. The
onnxruntime-genai process is given the prompt's token ids and loads no tokenizer; specrt's includes loading its
tokenizer, tokenizing and detokenizing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

PROMPT = "What is the capital of France?"

GENAI = """
import sys
import numpy as np
import onnxruntime_genai as og
model = og.Model(sys.argv[1])
ids = [int(t) for t in sys.argv[2].split(",")]
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(ids) + 1)
gen = og.Generator(model, params)
gen.append_tokens(np.asarray([ids], dtype=np.int32))
gen.generate_next_token()
print(int(gen.get_sequence(0)[-1]))
"""


GENAI_TEXT = """
import sys
import onnxruntime_genai as og
model = og.Model(sys.argv[1])
tokenizer = og.Tokenizer(model)
ids = tokenizer.encode(sys.argv[2])
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(ids) + 1)
gen = og.Generator(model, params)
gen.append_tokens(ids)
gen.generate_next_token()
print(tokenizer.decode(gen.get_sequence(0)[len(ids):]))
"""


def timed(cmd: list[str]) -> tuple[float, str]:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: imports read cached bytecode (written by the warm run)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd[:4])}... failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return seconds, proc.stdout


def genai_dir_for(bundle: Path) -> Path:
    """onnxruntime-genai's model of the checkpoint the bundle was compiled from (built once, cached)."""
    from specrt.bench.peer_ortgenai import build
    from specrt.bench.peer_sources import resolve
    from specrt.bundle.manifest import read_manifest

    manifest = read_manifest(bundle, verify_checksums=False)
    settings = SimpleNamespace(target_checkpoint=None, draft_checkpoint=None)
    target, _ = resolve(manifest, settings, "ort-genai")
    return build(target, progress=lambda text: print(text, file=sys.stderr) or (lambda: None))


def prompt_ids(bundle: Path) -> list[int]:
    from specrt.bundle.manifest import read_manifest
    from specrt.core.tokenizer import Tokenizer

    manifest = read_manifest(bundle, verify_checksums=False)
    return Tokenizer(manifest.path(manifest.tokenizer.path)).encode(PROMPT, add_special_tokens=False)


def bundle_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(bundle: Path, genai: Path, rounds: int) -> dict:
    ids = prompt_ids(bundle)
    ours_cmd = [sys.executable, "-m", "specrt", "generate", str(bundle), "--prompt", PROMPT, "--max-new-tokens", "1",
                "--method", "none"]
    theirs_cmd = [sys.executable, "-c", GENAI, str(genai), ",".join(map(str, ids))]
    text_cmd = [sys.executable, "-c", GENAI_TEXT, str(genai), PROMPT]
    timed(ours_cmd), timed(theirs_cmd), timed(text_cmd)  # untimed: page cache and .pyc files warm for all
    ours, theirs, text = [], [], []
    for i in range(rounds):
        trio = [(ours, ours_cmd), (theirs, theirs_cmd), (text, text_cmd)]
        for out, cmd in (trio if i % 2 == 0 else trio[::-1]):  # alternate who goes first
            out.append(timed(cmd)[0])
    o, t, x = statistics.median(ours), statistics.median(theirs), statistics.median(text)
    return {"prompt": PROMPT, "prompt_tokens": len(ids), "rounds": rounds, "ours_s": ours, "theirs_s": theirs,
            "theirs_text_s": text, "ours_median_s": o, "theirs_median_s": t, "theirs_text_median_s": x,
            "ratio": o / t, "ratio_text": o / x,
            "ours_bytes": bundle_bytes(bundle), "theirs_bytes": bundle_bytes(genai),
            "bundle": str(bundle), "genai_dir": str(genai), "cores": os.cpu_count(),
            "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def markdown(r: dict) -> str:
    mib = 2 ** 20
    return (
        "## Cold start and bundle size (SmolLM2-135M-Instruct)\n\n"
        f"Generated by `python scripts/cold_start.py` on {r['date']}, {r['cores']} cores, load average "
        f"{r['load_average'][0]:.1f} while measuring (a shared machine: compare the ratios, not the seconds).\n"
        "Process start to exit, one token after a "
        f"{r['prompt_tokens']}-token prompt, {r['rounds']} alternated rounds, medians. specrt loads its tokenizer, "
        "encodes the prompt and decodes the token; the first onnxruntime-genai process is given the token ids and "
        "loads no tokenizer, the second does what specrt does (`og.Tokenizer`, encode, decode).\n\n"
        "| | cold start (s) | model on disk (MiB) |\n|---|---|---|\n"
        f"| specrt `generate --max-new-tokens 1` | {r['ours_median_s']:.2f} | {r['ours_bytes'] / mib:.1f} |\n"
        f"| onnxruntime-genai (Python, load + 1 token from ids) | {r['theirs_median_s']:.2f} | "
        f"{r['theirs_bytes'] / mib:.1f} |\n"
        f"| onnxruntime-genai (Python, load + tokenizer + 1 token from text) | {r['theirs_text_median_s']:.2f} | |\n"
        f"| ratio specrt / genai from ids | {r['ratio']:.2f}x | {r['ours_bytes'] / r['theirs_bytes']:.2f}x |\n"
        f"| ratio specrt / genai from text | {r['ratio_text']:.2f}x | |\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--genai-dir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("error: --rounds must be >= 1")
    genai = args.genai_dir or genai_dir_for(args.bundle)
    result = measure(args.bundle, genai, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    if args.markdown:
        args.markdown.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
