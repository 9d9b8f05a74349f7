"""Seeding a bundle's successor table from the target's own greedy answers (Token Recycling's warm start).

    table = seed_table(gen)                         # the built-in prompts (recycle_prompts.py)
    table = seed_table(gen, read_prompts(FILE))     # one prompt per line (blank lines skipped)
    write_table(table, bundle_dir)                  # -> recycle/table.npy (int32 [V, K])

Each prompt is rendered with the bundle's chat template and answered greedily for up to `max_new_tokens` tokens,
8 prompts at a time on the batch engine; then the prompt and its answer run once more, the answer's rows in one
multi-row pass, and every row refreshes the table (the row of token t gives succ[t]): the rows a step-by-step
greedy decode computes. Cost: 48 prompts x 48 tokens is ~290 batched passes of 8 rows plus ~100 multi-row passes
(SmolLM2-135M fp32: 2.1x faster than one prompt at a time, ~1.7 CPU-minutes; the step-by-step version took 3.5;
seconds on the test models). `specrt compile` runs it as its last step
(specrt/cli/recycle_step.py) so the file is listed and hashed in the manifest like every other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.core.errors import BundleError, InvalidArgument
from specrt.runtime.proposers.recycle_table import TABLE_FILE, TOP_K, SuccessorTable

SEED_NEW_TOKENS = 48
SEED_BATCH = 8  # answers generated together on the batch engine
SEED_CHUNK = 128  # answer rows per teacher-forced pass
MAX_SEED_PROMPT_TOKENS = 512


def read_prompts(path: Path) -> list[str]:
    """One prompt per line of a UTF-8 text file (blank lines skipped); InvalidArgument naming the file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read --recycle-prompts file {path}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise InvalidArgument(f"--recycle-prompts file {path} holds no prompts (one per line)")
    return prompts


def seed_table(gen, prompts: list[str] | None = None, max_new_tokens: int = SEED_NEW_TOKENS,
               top_k: int = TOP_K, batch: int = SEED_BATCH) -> SuccessorTable:
    """A table refreshed with every row of `gen`'s target greedily answering `prompts` (default: built-in).

    The answers are generated `batch` at a time on the batch engine (runtime/batch/: one batched pass per token for
    all of them; `batch` 1, or an engine that cannot start, answers one prompt at a time); then each prompt and its
    answer run through the target once more, the answer's rows in one multi-row pass, whose rows refresh the table
    (the row of token t gives succ[t])."""
    from specrt.runtime.chat_template import chat_prompt_ids
    from specrt.runtime.proposers.recycle_prompts import PROMPTS

    target = gen.target
    table = SuccessorTable(gen.vocab_size, top_k)
    todo = []
    for text in prompts if prompts is not None else PROMPTS:
        ids = np.array(chat_prompt_ids(gen, text), dtype=np.int64)[-MAX_SEED_PROMPT_TOKENS:]
        room = min(max_new_tokens, target.capacity - ids.size - 1)
        if ids.size and room >= 1:
            todo.append((ids, room))
    for (ids, _), answer in zip(todo, greedy_answers(gen, todo, batch)):
        # the rows a greedy decode computes: the prompt's last token's, then every answer token's but the last
        # (an EOS, or the token reached at the budget)
        rows = np.concatenate([ids[-1:], np.array(answer[:-1], np.int64)])
        target.set_argmax_only(False)  # full rows: the table wants each row's top-k, not only its argmax
        target.reset()
        if ids.size > 1:
            target.prefill(ids[:-1])
        for start in range(0, rows.size, SEED_CHUNK):
            chunk = rows[start:start + SEED_CHUNK]
            table.refresh(chunk, target.forward(chunk))
    target.reset()
    return table


def greedy_answers(gen, todo: list, batch: int) -> list[list[int]]:
    """The target's greedy answer (token ids, EOS included when reached) to each (prompt ids, max new tokens)."""
    if not todo:
        return []
    if batch > 1:
        try:
            engine = gen.engine(max_batch=min(batch, len(todo)))
        except (InvalidArgument, BundleError):  # no batch graph or no memory for it: one prompt at a time
            engine = None
        if engine is not None:
            with engine:
                out = []
                for room in sorted({r for _, r in todo}):
                    group = [i for i, (_, r) in enumerate(todo) if r == room]
                    res = engine.generate_batch([todo[i][0].tolist() for i in group], room, method="none",
                                                temperature=0)
                    out += list(zip(group, [r.token_ids for r in res]))
                return [ids for _, ids in sorted(out)]
    return [gen.generate(ids.tolist(), room, method="none", temperature=0).token_ids for ids, room in todo]


def write_table(table: SuccessorTable, root: Path) -> Path:
    """Write `table` as root/recycle/table.npy (int32 [V, K]); returns the path."""
    path = Path(root) / TABLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(table.to_bytes())
    return path
