"""The worker-thread side of a request: drive `Generator.stream_tokens`, detokenize, apply stop strings.

`run_job` never raises: it emits `Delta` events (text and the number of tokens of one decoding step)
and exactly one final `Done` (finish reason, stats, or the error). It checks the cancel flag between
steps; leaving the loop closes the token generator, which releases the Generator's lock.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Optional, Sequence

from specrt.core.tokenizer import TextStage
from specrt.runtime.request import GenerationRequest
from specrt.serve.logprobs import entries


@dataclasses.dataclass
class Job:
    prompt_ids: list[int]
    request: GenerationRequest  # resolved: sampling defaults filled, checked against the bundle
    prepared: Any = None  # its PreparedRequest (runtime/prepared.py): what the slot runs, checked once

    @classmethod
    def of(cls, prepared: Any) -> "Job":
        return cls(prepared.prompt_ids.tolist(), prepared.request, prepared)

    @property
    def max_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def stop(self) -> Sequence[str]:
        return self.request.stop


@dataclasses.dataclass
class Delta:
    text: str  # may be "" (incomplete UTF-8, or text held back while it may start a stop string)
    tokens: int  # tokens produced by this step
    t: float  # time.perf_counter() when the step finished
    logprobs: list = dataclasses.field(default_factory=list)  # with request.logprobs: the step's tokens' entries


@dataclasses.dataclass
class Done:
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    completion_tokens: int = 0
    stats: Any = None  # GenerationStats (None when nothing ran)
    error: Optional[BaseException] = None


def run_job(gen: Any, job: Job, cancel: threading.Event, emit: Callable[[Any], None]) -> None:
    stage = TextStage(gen.tokenizer, job.stop)  # the one detokenize / stop-string stage (core/tokenizer.py)
    tokens, stats, finish = 0, None, None
    names: dict = {}  # token id -> (string, bytes), for logprobs
    if cancel.is_set():  # stopped while it waited for the thread (the client left, the server shuts down)
        emit(Done("cancelled"))
        return
    try:
        # the stop strings are watched here, on the text this stage makes: not a second time by stream_tokens
        steps = gen.stream_tokens(job.prepared.without_stop())
        try:
            for ids, stats in steps:
                text = stage.push(ids)
                n = stage.kept  # the step's tokens up to the one that completed a stop string
                lp = entries(gen.tokenizer, stats.token_logprobs[tokens:tokens + n], names) \
                    if job.request.logprobs is not None else []
                tokens += n
                emit(Delta(text, n, time.perf_counter(), lp))
                if stage.stopped:
                    finish = "stop"
                    break
                if cancel.is_set():
                    finish = "cancelled"
                    break
        finally:
            steps.close()  # releases the generator's lock at once
        if finish is None:
            text = stage.finish()
            if text:
                emit(Delta(text, 0, time.perf_counter()))
            finish = "stop" if stage.stopped else (stats.finish_reason or "length")
        emit(Done(finish, tokens, stats))
    except BaseException as exc:  # noqa: BLE001 - reported to the request, never lost in the thread
        emit(Done("error", tokens, stats, exc))
