"""What `specrt store --from SOURCE` reads into a datastore (runtime/proposers/store.py): token sequences of the
target's own text, checked against the bundle's vocabulary. Every bad input is InvalidArgument, one line naming
the file (exit 2), raised before anything is written.

    seqs, note = read_source(gen, Path("answers.jsonl"))        # texts, tokenized with the bundle's tokenizer
    seqs, note = answer_prompts(gen, prompts, max_new_tokens)   # the bundle's own greedy answers (batch engine)
    prompts = builtin_prompts()                                  # `--answers builtin`: the packaged prompt set

SOURCE: a `.txt` (each non-empty line is a text), a `.jsonl` (a line is a JSON string, {"text": ...}, or an
OpenAI-style {"messages": [{"role", "content"}, ...]} whose assistant turns are the texts), a directory of answer
shards (shard-NNNNN/ with ids.npy, starts.npy and meta.json holding each sample's prompt_len: the tokens past each
prompt; a shard whose meta.json is under 2 minutes old is still being written and is skipped), or an `.npz` with
`corpus` and `order` (a datastore written before, e.g. by scripts/store_replay.py's tooling).
`exclude`: .jsonl files of questions (Spec-Bench's {"turns": [...]}, {"prompt": ...} or a string); a sample whose prompt
(shards, answers, a conversation's user turns) or text holds the start (40 characters) of one is dropped, so a
datastore measured on those questions never holds their answers.
"""

from __future__ import annotations

import glob
import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.core.textfile import MIB, read_user_text

SOURCE_MAX_BYTES = 256 * MIB
HEAD_CHARS = 40  # the start of a question that marks a sample as excluded
FRESH_SHARD_S = 120  # a shard's meta.json younger than this is still being written


Exclude = Path | Sequence[Path] | None


BUILTIN = "builtin"  # `specrt store --answers builtin`, `specrt compile --store builtin`: the packaged prompt set


def is_builtin(path: str | Path | None) -> bool:
    """Whether an option's value names the packaged prompt set (a file of that name wins)."""
    return path is not None and str(path) == BUILTIN and not Path(path).exists()


def builtin_prompts_path() -> Path:
    """The prompt set shipped with specrt: specrt/assets/head/prompts.txt (`specrt train-head`'s default prompts and
    `--answers builtin`'s)."""
    from importlib.resources import files

    return Path(str(files("specrt.assets.head") / "prompts.txt"))


def builtin_prompts() -> list[str]:
    """The packaged prompt set's prompts (`prompt_lines`)."""
    return prompt_lines(builtin_prompts_path().read_text(encoding="utf-8"))


def prompt_lines(text: str) -> list[str]:
    """A prompt set's prompts: one per non-blank line not starting with `#`, `\\n` written for a newline."""
    lines = [ln.strip() for ln in text.splitlines()]
    return [ln.replace("\\n", "\n") for ln in lines if ln and not ln.startswith("#")]


def exclusion_heads(exclude: Exclude) -> list[str]:
    """The question starts of every --exclude file."""
    paths = [] if exclude is None else [exclude] if isinstance(exclude, (str, Path)) else list(exclude)
    return [h for path in paths for h in read_heads(Path(path))]


def read_source(gen, source: Path, exclude: Exclude = None) -> tuple[list[np.ndarray], str]:
    """(token sequences, a note saying what was read) from SOURCE."""
    source = Path(source)
    heads = exclusion_heads(exclude)
    if not source.exists():
        raise InvalidArgument(f"--from {source}: no such file or directory")
    if source.is_dir():
        seqs, dropped = shard_answers(gen, source, heads)
        note = f"{len(seqs)} answers from {source} ({dropped} excluded)"
    elif source.suffix.lower() == ".npz":
        return npz_sequences(gen, source), f"the datastore {source}"
    elif source.suffix.lower() in (".jsonl", ".txt"):
        texts = read_texts(source)
        kept = [t for asked, t in texts if not _held(asked + "\n" + t, heads)]
        seqs = [np.array(gen.tokenizer.encode(t, add_special_tokens=False), np.int64) for t in kept]
        note = f"{len(seqs)} texts from {source} ({len(texts) - len(kept)} excluded)"
    else:
        raise InvalidArgument(f"--from {source}: expected a .jsonl or .txt of texts, a shard directory or an .npz")
    seqs = [s for s in seqs if s.size]
    if not seqs:
        raise InvalidArgument(f"--from {source} holds no text to store")
    return seqs, note


def read_texts(path: Path) -> list[tuple[str, str]]:
    """(what was asked, the text) of each text of a .txt (non-empty lines) or .jsonl (strings, "text", assistant
    turns of "messages" with the conversation's user turns as what was asked)."""
    lines = read_user_text(path, "--from", SOURCE_MAX_BYTES).splitlines()
    if path.suffix.lower() == ".txt":
        return [("", line) for line in lines if line.strip()]
    texts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        texts += _line_texts(_json_line(line, f"{path}:{n}"), f"{path}:{n}")
    return texts


def _json_line(line: str, where: str):
    try:
        return json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        raise InvalidArgument(f"{where}: not JSON; a .jsonl file has one JSON value per line") from None


def _line_texts(value, where: str) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [("", value)]
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return [("", value["text"])]
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        turns = value["messages"]
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in turns):
            raise InvalidArgument(f"{where}: every message needs a string \"content\"")
        asked = "\n".join(m["content"] for m in turns if m.get("role") == "user")
        return [(asked, m["content"]) for m in turns if m.get("role") == "assistant"]
    raise InvalidArgument(f"{where}: a line is a JSON string, {{\"text\": ...}} or {{\"messages\": [...]}}")


def _held(text: str, heads: list[str]) -> bool:
    return any(h in text for h in heads)


def read_heads(path: Path) -> list[str]:
    """The starts of the questions of an --exclude .jsonl."""
    heads = []
    for n, line in enumerate(read_user_text(path, "--exclude", SOURCE_MAX_BYTES).splitlines(), 1):
        if not line.strip():
            continue
        v = _json_line(line, f"{path}:{n}")
        q = v if isinstance(v, str) else (v.get("prompt") or (v.get("turns") or [None])[0]) if isinstance(v, dict) \
            else None
        if not isinstance(q, str) or not q:
            raise InvalidArgument(f"{path}:{n}: a question is a JSON string, {{\"turns\": [...]}} or "
                                  "{\"prompt\": ...}")
        heads.append(q[:HEAD_CHARS])
    return heads


def shard_answers(gen, shards: Path, heads: list[str]) -> tuple[list[np.ndarray], int]:
    """(the answers of every finished shard, how many were dropped by `heads`)."""
    dirs = sorted(glob.glob(os.path.join(shards, "shard-*")))
    if not dirs:
        raise InvalidArgument(f"--from {shards}: a directory must hold answer shards (shard-NNNNN/ with ids.npy, "
                              "starts.npy, meta.json)")
    seqs, dropped = [], 0
    for d in dirs:
        meta = os.path.join(d, "meta.json")
        if not os.path.exists(meta) or time.time() - os.path.getmtime(meta) < FRESH_SHARD_S:
            continue
        try:
            ids, starts = np.load(f"{d}/ids.npy", allow_pickle=False), np.load(f"{d}/starts.npy", allow_pickle=False)
            rows = json.loads(Path(meta).read_text(encoding="utf-8"))
            spans = [(int(starts[i]) + int(m["prompt_len"]), int(starts[i]), int(starts[i + 1]))
                     for i, m in enumerate(rows)]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise InvalidArgument(f"--from {d}: not a readable answer shard ({exc})") from None
        for cut, start, end in spans:
            if heads and _held(gen.tokenizer.decode(ids[start:cut].tolist()), heads):
                dropped += 1
                continue
            seqs.append(ids[cut:end])
    return seqs, dropped


def npz_sequences(gen, path: Path) -> list[np.ndarray]:
    """The sequences of a stored datastore (`corpus` split at SEP; its `order` is rebuilt and checked on use)."""
    from specrt.runtime.proposers.store import SEP

    try:
        with np.load(path, allow_pickle=False) as z:
            corpus = np.asarray(z["corpus"])
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidArgument(f"--from {path}: not a datastore .npz with a `corpus` array ({exc})") from None
    if corpus.ndim != 1 or corpus.dtype.kind not in "iu":
        raise InvalidArgument(f"--from {path}: `corpus` must be a 1-D integer array, got {corpus.dtype} {corpus.shape}")
    parts = [p[p != SEP] for p in np.split(corpus.astype(np.int64), np.flatnonzero(corpus == SEP))]
    return [p for p in parts if p.size]


def build_store(gen, seqs: list[np.ndarray], source: str):
    """The Datastore of `seqs`, whose ids must lie in the bundle's vocabulary (a source made for another model
    does not)."""
    from specrt.runtime.proposers.store import Datastore

    lo = min(int(s.min()) for s in seqs)
    hi = max(int(s.max()) for s in seqs)
    if lo < 0 or hi >= gen.vocab_size:
        raise InvalidArgument(f"{source} holds token id {hi if hi >= gen.vocab_size else lo} outside the bundle's "
                              f"vocabulary [0, {gen.vocab_size}): was it made with another model's tokenizer?")
    return Datastore.from_sequences(seqs)


def answer_prompts(gen, prompts: list, max_new_tokens: int, exclude: Exclude = None, skip_long: bool = False
                   ) -> tuple[list[np.ndarray], str]:
    """The target's greedy answers to `prompts` (str: a user message; {"chat", "system"}), each rendered with the
    bundle's chat template, generated several at a time on the batch engine (recycle_seed.greedy_answers). A prompt
    that leaves no room to answer in the bundle's --max-seq-len is an error, or skipped with `skip_long` (the
    packaged prompt set: the bundle was not made for it)."""
    from specrt.runtime.chat_template import chat_prompt_ids
    from specrt.runtime.proposers.recycle_seed import SEED_BATCH, greedy_answers

    if max_new_tokens < 1:
        raise InvalidArgument(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    heads = exclusion_heads(exclude)
    todo, long = [], 0
    for p in prompts:
        chat, system = (p["chat"], p["system"]) if isinstance(p, dict) else (p, None)
        if _held(chat, heads):
            continue
        ids = np.array(chat_prompt_ids(gen, chat, system), np.int64)
        room = min(max_new_tokens, gen.max_seq_len - ids.size - 1)
        if room < 1 and skip_long:
            long += 1
            continue
        if room < 1:
            raise InvalidArgument(f"a prompt of {ids.size} tokens leaves no room to answer in the bundle's "
                                  f"--max-seq-len {gen.max_seq_len}: {chat[:40]!r}")
        todo.append((ids, room))
    if not todo:
        why = (f"leaves room to answer in the bundle's --max-seq-len {gen.max_seq_len}" if long
               else "is left after --exclude")
        raise InvalidArgument(f"no prompt {why}: nothing to store")
    answers = [np.array(a, np.int64) for a in greedy_answers(gen, todo, SEED_BATCH)]
    skipped = f", {long} too long for its --max-seq-len" if long else ""
    return answers, (f"the bundle's answers to {len(todo)} prompts ({len(prompts) - len(todo) - long} excluded"
                     f"{skipped})")
