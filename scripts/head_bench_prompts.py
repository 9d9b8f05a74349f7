"""Write the held-out chat prompts of a draft-head run as a `specrt bench --prompts` JSONL (suite "open-chat").

    python scripts/head_bench_prompts.py TARGET_CHECKPOINT_DIR OUT.jsonl [PROMPTS.txt]
    python scripts/head_bench_prompts.py TARGET_CHECKPOINT_DIR OUT.jsonl PROMPTS.txt --all [--suite NAME]

The prompts are the ones `specrt train-head` holds out (every tenth of the prompt set; never trained on),
rendered with the target's chat template, so the benchmark measures the head on answers it never saw. The
held-out prompts share topics with the training prompts ("Explain X" is held out, "Why is X important?" is
trained on); `--all` renders every line of PROMPTS.txt instead (benchmarks/head_fresh_prompts.txt: topics and
tasks the training set does not have; suite "fresh-chat").
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


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--all"]
    name = None
    if "--suite" in args:
        i = args.index("--suite")
        name = args[i + 1]
        del args[i:i + 2]
    main(Path(args[0]), Path(args[1]), Path(args[2]) if len(args) > 2 else None, "--all" in sys.argv, name)
