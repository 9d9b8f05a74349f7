"""Write the held-out chat prompts of a draft-head run as a `specrt bench --prompts` JSONL (suite "open-chat").

    python scripts/head_bench_prompts.py TARGET_CHECKPOINT_DIR OUT.jsonl [PROMPTS.txt]

The prompts are the ones `specrt train-head` holds out (every tenth of the prompt set; never trained on),
rendered with the target's chat template, so the benchmark measures the head on answers it never saw.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specrt.recipes.head_data import checkpoint_chat_formatter, read_prompts
from specrt.recipes.train_head import heldout_prompts


def main(target_dir: Path, out: Path, prompts: Path | None) -> None:
    texts = read_prompts(prompts)
    fmt = checkpoint_chat_formatter(target_dir)
    lines = [json.dumps({"prompt": fmt.render([{"role": "user", "content": texts[i]}])[0], "suite": "open-chat"})
             for i in sorted(heldout_prompts(len(texts)))]
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
