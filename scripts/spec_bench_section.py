"""BENCHMARKS.md's Spec-Bench section (issue #51; `SECTIONS=spec-bench scripts/make_benchmarks.sh`): every
measurement the section states, each by the command a user would run, then the section (scripts/spec_bench_report.py).

1. per bundle (fp32 target only, int4 target only, fp32 with `--draft self:int4`) one interleaved run of
   `specrt bench BUNDLE --suite spec-bench --methods ngram,recycle,auto[,draft,hybrid]`, and one of
   `specrt bench BUNDLE --suite spec-bench --free-rows` (auto's MAT with every pass priced as one row), each in its
   own process (a fresh successor table: no question is seen twice before it is measured);
2. open chat prompts outside Spec-Bench (benchmarks/head_fresh_prompts.txt, never used for training or tuning) on
   the fp32 bundle, as a question file of one category (`--suite spec-bench:FILE`): ngram and auto;
3. `auto` vs plain on `specrt demo`'s prompts (scripts/demo_prompts_bench.py) on the fp32 bundle;
4. the measured cost of a target pass of S rows, T(S)/T(1) for S = 1 .. max draft tokens + 1 at a past of 300
   (specrt/bench/measure.py verify_curve), per bundle, and the draft model's step against the target's;
5. optional (issue #52), with --head B or env SPEC_HEAD=B (the fp32 target compiled with its fused draft head): one
   interleaved run of `specrt bench B --suite spec-bench --methods 'ngram,auto[-head],auto'`: auto without the head
   (`--auto-sources=-head`) and with it, each its own row;
6. optional (issue #51), with --store B or env SPEC_STORE=B (the fp32 target with a datastore of its own answers,
   `specrt store B --answers builtin`): the same with `ngram,auto[-store],auto`, on Spec-Bench and on the open chat
   prompts; with --store-int4 B or env SPEC_STORE_INT4=B (the int4 target with one) the same on Spec-Bench.

    python scripts/spec_bench_section.py --fp32 B --int4 B --self B [--per-category 4] [--max-new-tokens 128]
        [--open-per-category 12] [--demo-repeats 5] [--out benchmarks] [--markdown benchmarks/sections/spec_bench.md]
        [--head B]         (default: env SPEC_HEAD; unset: no head bundle)
        [--store B]        (default: env SPEC_STORE; unset: no datastore bundle)
        [--store-int4 B]   (default: env SPEC_STORE_INT4; unset: no int4 datastore bundle)
        [--compose-only]   (only the section, from the JSON files a previous run wrote)
        [--resume]         (keep the JSON files an interrupted run already wrote; measure the rest)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
OPEN_PROMPTS = ROOT / "benchmarks" / "head_fresh_prompts.txt"
METHODS = {"fp32": "ngram,recycle,auto", "int4": "ngram,recycle,auto", "self": "ngram,recycle,draft,hybrid,auto",
           "head": "ngram,auto[-head],auto",  # head: auto without its draft head and with it (issue #52)
           "store": "ngram,auto[-store],auto",  # store: auto without its datastore and with it (issue #51)
           "store_int4": "ngram,auto[-store],auto"}
KEPT = "# kept from an earlier run"  # a --resume run's log line for a file it did not measure again
EXTRA = ("head", "store", "store_int4")  # bundles measured on Spec-Bench only (no free-rows run, no cost curve)


def run(cmd: list[str], log: list[str], done: Path | None = None) -> None:
    """Runs `cmd` (its output file `done`: kept from an earlier run with --resume)."""
    line = " ".join(shlex.quote(str(c)) for c in cmd)
    if done is not None and done.is_file():
        print(f"== kept {done} (--resume)", file=sys.stderr, flush=True)
        log.append(f"{line}  {KEPT}")
        return
    print(f"== {line}", file=sys.stderr, flush=True)
    t0 = time.time()
    subprocess.run([str(c) for c in cmd], check=True)
    log.append(f"{line}  # {time.time() - t0:.0f} s")


def open_questions(path: Path, out: Path) -> Path:
    """The open chat prompts as a question file of one category (`open_chat`)."""
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    out.write_text("".join(json.dumps({"category": "open_chat", "turns": [ln]}) + "\n"
                           for ln in lines if ln and not ln.startswith("#")), encoding="utf-8")
    return out


def row_costs(bundles: dict[str, str], past: int = 300) -> dict:
    """Per bundle: T(S)/T(1) for S = 1 .. max draft tokens + 1 (median of 7 interleaved rounds), the default method,
    and (with a draft model) the draft step's seconds over the target's one-row pass."""
    from specrt.bench.measure import verify_curve
    from specrt.runtime import load

    out = {}
    for label, bundle in bundles.items():
        gen = load(bundle)
        curve = verify_curve(gen.target, past, range(gen.max_draft_tokens + 1))
        verify, draft = gen._load_costs[:2]
        out[label] = {"rows": [k + 1 for k in curve["k"]], "seconds": curve["seconds"], "ratio": curve["ratio"],
                      "past": curve["past_length"], "default_method": gen.default_method,
                      "draft_over_target": (draft / verify[0]) if draft else None}
        gen.close()
    return out


def carried_over(meta: dict, before: dict) -> dict:
    """With --resume: a kept file's run keeps the time the earlier run recorded for it, the minutes are those of
    every run, and when nothing was measured now the date and load average stay the earlier run's."""
    timed = {line.rsplit("  #", 1)[0]: line for line in before.get("runs", []) if not line.endswith(KEPT)}
    runs = [timed.get(line.rsplit("  #", 1)[0], line) if line.endswith(KEPT) else line for line in meta["runs"]]
    seconds = sum(float(line.rsplit("# ", 1)[1].split()[0]) for line in runs if line.endswith(" s"))
    fresh = any(line.endswith(" s") and line not in before.get("runs", []) for line in meta["runs"])
    out = dict(meta, runs=runs, minutes=seconds / 60)
    if not fresh:
        out.update(date=before.get("date", meta["date"]), load_average=before.get("load_average", meta["load_average"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fp32", required=True, help="fp32 target-only bundle (with the tree mask input)")
    ap.add_argument("--int4", required=True, help="the same target compiled with --quantize int4")
    ap.add_argument("--self", dest="self_", required=True, help="the fp32 target compiled with --draft self:int4")
    ap.add_argument("--head", default=os.environ.get("SPEC_HEAD") or None,
                    help="the fp32 target compiled with its fused draft head (default: env SPEC_HEAD; unset: skipped)")
    ap.add_argument("--store", default=os.environ.get("SPEC_STORE") or None,
                    help="the fp32 target with a datastore (`specrt store`; default: env SPEC_STORE; unset: skipped)")
    ap.add_argument("--store-int4", default=os.environ.get("SPEC_STORE_INT4") or None,
                    help="the int4 target with a datastore (default: env SPEC_STORE_INT4; unset: skipped)")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--open-per-category", type=int, default=12, help="open chat prompts (of 12)")
    ap.add_argument("--demo-repeats", type=int, default=5)
    ap.add_argument("--specrt", default=os.environ.get("SPECRT", "specrt"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks"), help="directory of the JSON files")
    ap.add_argument("--markdown", type=Path, default=Path("benchmarks/sections/spec_bench.md"))
    ap.add_argument("--compose-only", action="store_true")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    if min(args.per_category, args.open_per_category, args.demo_repeats) < 1 or args.max_new_tokens < 2:
        ap.error("--per-category, --open-per-category, --demo-repeats must be >= 1 and --max-new-tokens >= 2")
    bundles = {"fp32": args.fp32, "int4": args.int4, "self": args.self_}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    files = {label: out / f"spec_bench_{label}.json" for label in bundles}
    files.update({f"{label}_free": out / f"spec_bench_{label}_free.json" for label in bundles})
    if args.head:  # after the free-rows files: only the three bundles above have those
        bundles["head"] = args.head
        files["head"] = out / "spec_bench_head.json"
    if args.store:
        bundles["store"] = args.store
        files["store"] = out / "spec_bench_store.json"
        files["open_store"] = out / "spec_bench_open_store.json"
    if args.store_int4:
        bundles["store_int4"] = args.store_int4
        files["store_int4"] = out / "spec_bench_store_int4.json"
    files.update(open=out / "spec_bench_open_fp32.json", demo=out / "spec_bench_demo.json",
                 costs=out / "spec_bench_row_costs.json", meta=out / "spec_bench_meta.json")
    if not args.compose_only:
        log: list[str] = []
        keep = (lambda path: path) if args.resume else (lambda path: None)
        started = time.time()
        sized = ["--per-category", str(args.per_category), "--max-new-tokens", str(args.max_new_tokens)]
        for label, bundle in bundles.items():
            run([args.specrt, "bench", bundle, "--suite", "spec-bench", *sized, "--methods", METHODS[label],
                 "--json", files[label], "--quiet"], log, keep(files[label]))
            if label in EXTRA:
                continue
            run([args.specrt, "bench", bundle, "--suite", "spec-bench", *sized, "--free-rows",
                 "--json", files[f"{label}_free"], "--quiet"], log, keep(files[f"{label}_free"]))
        questions = open_questions(OPEN_PROMPTS, out / "spec_bench_open_questions.jsonl")
        run([args.specrt, "bench", args.fp32, "--suite", f"spec-bench:{questions}", "--per-category",
             str(args.open_per_category), "--max-new-tokens", str(args.max_new_tokens), "--methods", "ngram,auto",
             "--json", files["open"], "--quiet"], log, keep(files["open"]))
        if args.store:
            run([args.specrt, "bench", args.store, "--suite", f"spec-bench:{questions}", "--per-category",
                 str(args.open_per_category), "--max-new-tokens", str(args.max_new_tokens), "--methods",
                 METHODS["store"], "--json", files["open_store"], "--quiet"], log, keep(files["open_store"]))
        run([sys.executable, ROOT / "scripts" / "demo_prompts_bench.py", args.fp32, "--repeats",
             str(args.demo_repeats), "--max-new-tokens", str(args.max_new_tokens), "--json", files["demo"]], log,
            keep(files["demo"]))
        if not (args.resume and files["costs"].is_file()):
            costed = {label: b for label, b in bundles.items() if label not in EXTRA}  # their targets' costs: above
            files["costs"].write_text(json.dumps(row_costs(costed), indent=2) + "\n", encoding="utf-8")
        from specrt.bench.measure import cpu_model

        env = "".join(f"{k}={shlex.quote(os.environ[k])} " for k in ("SPEC_HEAD", "SPEC_STORE", "SPEC_STORE_INT4")
                      if os.environ.get(k))
        meta = {"command": f"{env}python scripts/spec_bench_section.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "minutes": (time.time() - started) / 60,
                "cores": len(os.sched_getaffinity(0)), "cpu": cpu_model(), "load_average": os.getloadavg()[0],
                "runs": log, "bundles": bundles}
        if args.resume and files["meta"].is_file():
            meta = carried_over(meta, json.loads(files["meta"].read_text(encoding="utf-8")))
        files["meta"].write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    from spec_bench_report import section

    data = {key: json.loads(path.read_text(encoding="utf-8")) for key, path in files.items()}
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(section(data), encoding="utf-8")
    print(f"wrote {args.markdown}", file=sys.stderr)


if __name__ == "__main__":
    main()
