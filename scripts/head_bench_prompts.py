"""Write the held-out chat prompts of a draft-head run as a `specrt bench --prompts` JSONL (suite "open-chat").

    python scripts/head_bench_prompts.py TARGET_CHECKPOINT_DIR OUT.jsonl [PROMPTS.txt]
    python scripts/head_bench_prompts.py TARGET_CHECKPOINT_DIR OUT.jsonl PROMPTS.txt --all [--suite NAME]
    python scripts/head_bench_prompts.py - OUT.jsonl --builtin code,grounded

The prompts are the ones `specrt train-head` holds out (every tenth of the prompt set; never trained on),
rendered with the target's chat template, so the benchmark measures the head on answers it never saw. The
held-out prompts share topics with the training prompts ("Explain X" is held out, "Why is X important?" is
trained on); `--all` renders every line of PROMPTS.txt instead (benchmarks/head_fresh_prompts.txt: topics and
tasks the training set does not have; suite "fresh-chat"). `--builtin` writes every prompt of `specrt bench`'s
built-in suites instead (raw text, no chat template), so that a prompt mix can hold code and grounded prompts too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specrt.recipes.head_data import checkpoint_chat_formatter, read_prompts
from specrt.recipes.train_head import heldout_prompts


def main(target_dir: Path, out: Path, prompts: Path | None, every: bool = False, suite: str | None = None) -> None:
    texts = read_prompts(prompts)
    fmt = checkpoint_chat_formatter(target_dir)
    picks = range(len(texts)) if every else sorted(heldout_prompts(len(texts)))
    suite = suite or ("fresh-chat" if every else "open-chat")
    lines = [json.dumps({"prompt": fmt.render([{"role": "user", "content": texts[i]}])[0], "suite": suite})
             for i in picks]
    out.write_text("\n".join(lines) + "\n")


def builtin(out: Path, names: list[str]) -> None:
    from specrt.bench.suites import BUILTIN, builtin_prompts

    picks = builtin_prompts(names, max(map(len, BUILTIN.values())))  # every prompt of each suite named
    out.write_text("".join(json.dumps({"prompt": p.text, "suite": p.suite}) + "\n" for p in picks))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target_dir", type=Path, help="the target checkpoint directory (- with --builtin)")
    ap.add_argument("out", type=Path)
    ap.add_argument("prompts", type=Path, nargs="?")
    ap.add_argument("--all", action="store_true", help="every prompt of PROMPTS, not the held-out ones")
    ap.add_argument("--suite", help="suite name (default open-chat, or fresh-chat with --all)")
    ap.add_argument("--builtin", help="comma-separated built-in bench suites to write instead (code,grounded,open)")
    a = ap.parse_args()
    if a.builtin:
        from specrt.core.errors import InvalidArgument

        try:
            builtin(a.out, a.builtin.split(","))
        except InvalidArgument as exc:
            raise SystemExit(f"error: {exc}") from None
        raise SystemExit(0)
    main(a.target_dir, a.out, a.prompts, a.all, a.suite)
