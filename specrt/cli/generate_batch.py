"""`specrt generate BUNDLE --prompts-file FILE`: many prompts in one run, decoded together on the continuous-batching
scheduler (runtime/batch/, docs/batching.md), one JSON line per prompt on stdout, in the file's order.

FILE: `.jsonl` (one JSON value per line: a string is a prompt; an object has "prompt", or "chat" with an optional
"system", rendered with the bundle's chat template) or any other text file (each non-empty line is a prompt).
`--max-batch N` requests decode at once (auto: as `specrt serve`, or one at a time when the file is too small for
batching to pay back the batch engine's start-up, `batching_pays`; 0 or 1, or a bundle that cannot batch: one at a
time on the Generator's loop, with the same output).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from specrt.core.errors import InvalidArgument
from specrt.runtime.batch.memory import auto_max_batch


def read_prompts(path: Path) -> list[Any]:
    """The file's prompts: str (a prompt) or dict {"chat", "system"} (a chat message), in order."""
    return [p for _, p in read_located(path)]


def read_located(path: Path) -> list[tuple[str, Any]]:
    """The file's prompts with where each is ("FILE:LINE"), in order. A regular UTF-8 file of at most
    PROMPTS_MAX_BYTES (core/textfile.py); an empty prompt is refused as the server refuses it."""
    from specrt.core.textfile import PROMPTS_MAX_BYTES, read_user_text

    text = read_user_text(path, "--prompts-file", PROMPTS_MAX_BYTES)
    prompts: list[tuple[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix.lower() != ".jsonl":
            prompts.append((f"{path}:{n}", line))
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"{path}:{n}: not JSON ({exc.msg}); a .jsonl file has one JSON value per line") from None
        except RecursionError:
            raise InvalidArgument(f"{path}:{n}: nested too deeply; a line is a JSON string or a flat object") from None
        prompts.append((f"{path}:{n}", _entry(value, f"{path}:{n}")))
    if not prompts:
        raise InvalidArgument(f"--prompts-file {path} has no prompts")
    return prompts


def _entry(value: Any, where: str) -> Any:
    if isinstance(value, str):
        if not value:
            raise InvalidArgument(f"{where}: the prompt is empty (the server refuses empty prompts too)")
        return value
    if isinstance(value, dict):
        unknown = set(value) - {"prompt", "chat", "system"}
        if unknown:
            raise InvalidArgument(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; use prompt, or chat and system")
        if ("prompt" in value) == ("chat" in value):
            raise InvalidArgument(f"{where}: give exactly one of \"prompt\" and \"chat\"")
        if "system" in value and "chat" not in value:
            raise InvalidArgument(f"{where}: \"system\" needs \"chat\"")
        for key in ("prompt", "chat", "system"):
            if key in value and not isinstance(value[key], str):
                raise InvalidArgument(f"{where}: \"{key}\" must be a string")
        if value.get("prompt") == "":
            raise InvalidArgument(f"{where}: \"prompt\" is empty (the server refuses empty prompts too)")
        return value["prompt"] if "prompt" in value else {"chat": value["chat"], "system": value.get("system")}
    raise InvalidArgument(f"{where}: a line is a JSON string or an object with \"prompt\" or \"chat\", "
                          f"got {type(value).__name__}")


def run_file(gen, prompts: list[Any], max_batch, max_new_tokens: int, options: Any,
             wheres: list[str] | None = None, prefix_cache_mb: float | None = None,
             variables: dict | None = None) -> tuple[list, float, int]:
    """(results in order, seconds, the batch size used: 0 = one at a time). `options`: the command's
    GenerationRequest (or its fields as a dict). Every prompt is prepared (checked) once, before any runs; an error
    names the prompt's place (`wheres`, "FILE:LINE"). `prefix_cache_mb`: the batch engine's prefix cache (None: its
    default; 0: off). `variables`: chat template variables for the chat lines (--chat-template-kwargs)."""
    from specrt.runtime.arguments import check_text
    from specrt.runtime.prepared import prepare_prompt

    wheres = wheres or [f"prompt {i + 1}" for i in range(len(prompts))]
    formatter = None
    if any(isinstance(p, dict) for p in prompts):
        from specrt.runtime.chat_template import ChatFormatter

        formatter = ChatFormatter.from_manifest(gen.manifest)
    request = gen.request("generate", max_new_tokens, **options) if isinstance(options, dict) \
        else gen.request("generate", max_new_tokens, options)
    rendered = []
    for where, p in zip(wheres, prompts):
        try:
            if isinstance(p, dict):
                from specrt.runtime.chat_template import chat_prompt_ids

                check_text(p["chat"], "chat")
                if p["system"] is not None:
                    check_text(p["system"], "system")
                p = chat_prompt_ids(gen, p["chat"], p["system"], formatter, variables)
            rendered.append(prepare_prompt(gen, p, request))
        except InvalidArgument as exc:
            raise InvalidArgument(f"{where}: {exc}") from None
    prompts = rendered
    n = min(int(auto_max_batch(gen) if max_batch == "auto" else max_batch), len(prompts))
    if max_batch == "auto" and n > 1 and not batching_pays(gen, len(prompts), max_new_tokens, n):
        n = 0  # a small file: done one at a time before the batch engine would have started
    t0 = time.perf_counter()
    if n <= 1:
        results = [gen.generate(p) for p in prompts]
        return results, time.perf_counter() - t0, 0
    engine = gen.engine(max_batch=n, prefix_cache_mb=prefix_cache_mb)
    try:
        results = engine.generate_batch(prompts)
    finally:
        engine.close()
    return results, time.perf_counter() - t0, n


BATCH_SAVING = 0.5  # the share of (1 - 1/b) of the one-at-a-time time that b requests decoded together save (measured
# SmolLM2 fp32, 2 prompts: 2.95-3.6 s batched against 4.3 s one at a time, i.e. ~25% = 0.5 x (1 - 1/2))


def batching_pays(gen, prompts: int, max_new_tokens: int, max_batch: int) -> bool:
    """Whether decoding `prompts` prompts `max_batch` at a time saves more time than starting the batch engine
    costs (its packed session; its cost table, measured on first use: runtime/batch/costs.py `startup_seconds`).
    2 prompts x 16 tokens took 5.2 s batched against 3.0 s one at a time."""
    import os

    from specrt.runtime.batch.costs import startup_seconds, step_seconds

    packed = os.environ.get("SPECRT_PACKED", "1") != "0"
    saved = BATCH_SAVING * (1 - 1 / max_batch) * prompts * max_new_tokens * step_seconds(gen)
    return saved > startup_seconds(gen, max_batch, packed)


def result_line(i: int, res) -> str:
    return json.dumps({"index": i, "text": res.text, "token_ids": res.token_ids, "finish_reason": res.finish_reason,
                       "stats": res.stats.to_dict()}, ensure_ascii=False)
