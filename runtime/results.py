"""What `Generator.generate`, `stream` and `stream_tokens` make of the decode steps: a `GenerationResult`, text
pieces, or (ids, stats) per step, each ending with the token whose text completes a stop string (`TextStage`).

`steps` yields (new token ids, prompt ids, stats) per step (Generator's run); closing it ends the generation.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from specrt.core.tokenizer import TextStage
from specrt.runtime.stats import GenerationStats


@dataclasses.dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # the new tokens only
    prompt_token_ids: list[int]
    stats: GenerationStats
    finish_reason: str
    logprobs: list | None = None  # with request.logprobs: a TokenLogprob per new token (runtime/logits_processors.py)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict()}


def collect(steps, stops: tuple[str, ...], tokenizer) -> GenerationResult:
    """Every step of `steps`, as one result (text cut before the first stop string)."""
    stage = TextStage(tokenizer, stops) if stops else None
    ids: list[int] = []
    parts: list[str] = []
    with contextlib.closing(steps):
        for chunk, prompt_ids, stats in steps:
            if stage is not None:
                parts.append(stage.push(chunk))
                if stage.stopped:  # the generation ends with this step's token that completed the stop string
                    ids.extend(end_at_stop(stats, chunk, stage))
                    break
            ids.extend(chunk)
    if stage is None:
        text = tokenizer.decode(ids)
    else:
        text = "".join(parts) + stage.finish()
        if stage.stopped:
            stats.finish_reason = "stop"
    logprobs = list(stats.token_logprobs) if stats.token_logprobs else None
    return GenerationResult(text, ids, prompt_ids, stats, stats.finish_reason, logprobs)


def end_at_stop(stats: GenerationStats, chunk: list[int], stage: TextStage) -> list[int]:
    """The stop step's tokens up to the one that completed the stop string (finish_reason "stop"); those after it
    are not output: not counted, no logprobs (the token counts then do not depend on how speculation grouped the
    tokens into steps)."""
    stats.finish_reason = "stop"
    dropped = len(chunk) - stage.kept
    if dropped > 0:
        stats.new_tokens -= dropped
        if stats.token_logprobs:
            del stats.token_logprobs[len(stats.token_logprobs) - dropped:]
    return chunk[:stage.kept]


def text_pieces(steps, stops: tuple[str, ...], tokenizer) -> Iterator[str]:
    """Text pieces as steps are accepted (incremental detokenization, cut before a stop string)."""
    stage = TextStage(tokenizer, stops)
    with contextlib.closing(steps):
        for chunk, _, stats in steps:
            piece = stage.push(chunk)
            if stage.stopped:
                end_at_stop(stats, chunk, stage)
            if piece:
                yield piece
            if stage.stopped:
                return
        tail = stage.finish()
        if stage.stopped:
            stats.finish_reason = "stop"
        if tail:
            yield tail


def token_steps(steps, stops: tuple[str, ...], tokenizer) -> Iterator[tuple[list[int], GenerationStats]]:
    """(new token ids, stats) per step; with stop strings, ends with the token whose text completes one."""
    stage = TextStage(tokenizer, stops) if stops else None
    with contextlib.closing(steps):
        for chunk, _, stats in steps:
            if stage is not None:
                stage.push(chunk)
                if stage.stopped:
                    chunk = end_at_stop(stats, chunk, stage)
            yield chunk, stats
            if stage is not None and stage.stopped:
                return
        if stage is not None:
            stage.finish()
            if stage.stopped:
                stats.finish_reason = "stop"
