"""The engine's output side: each request's one detokenize / stop-string stage, run as each step emits.

    out = RequestOutput(tokenizer, stops, deliver)   # the request's `BatchSequence.emit`
    deliver(Step(t, ids, text, stopped))            # once per step (on the engine thread, or where out is called)
    deliver(END) | deliver(exception)               # exactly once at the end

A request's stop strings are found as its step emits (the shared `TextStage`, core/tokenizer.py), so a request that
reaches one leaves the batch at the end of that step, whenever its caller reads it; steps after it are dropped.
Where `deliver` hands the steps is the caller's: a `queue.SimpleQueue` for the engine's own blocking calls
(`BatchEngine.events`, `generate_batch`, `stream_tokens`). The server runs the stage on its loop instead (each
step's ids handed over as they are: specrt/serve/engine_stream.py), so the engine's thread decodes nothing for it.
"""

from __future__ import annotations

import contextlib
import queue
import time
from typing import Any, Callable, Iterator, NamedTuple

from specrt.core.tokenizer import TextStage

END = object()  # the request has ended; its stats are complete


class Step(NamedTuple):  # a tuple, as the (time, ids) events BatchEngine.submit's queue always held
    t: float  # time.perf_counter() when the step emitted
    ids: list[int]  # the step's new token ids ([] for the text held back until the end)
    text: str  # the text safe to show now ("" when nothing was decoded: no text asked for and no stop string)
    stopped: bool = False  # this step's text reached a stop string: the request's last step


class RequestOutput:
    """`BatchSequence.emit` of one request: each step's new ids through the request's `TextStage` (only when `text` is
    asked for or the request has stop strings), handed to `deliver` as a `Step`; the end as `END` (or the error)."""

    def __init__(self, tokenizer: Any, stops, deliver: Callable[[Any], None], text: bool = True) -> None:
        self.stage = TextStage(tokenizer, stops)
        self.decode = text or bool(stops)  # without either, nothing is decoded on the engine's thread
        self.deliver = deliver
        self.seq: Any = None  # the request's BatchSequence, once it has emitted
        self.tokens = 0  # the ids delivered: its output's length

    def __call__(self, chunk: Any, seq: Any, t: float | None = None) -> None:
        """On the engine thread (or the thread that closes it), or on the thread the caller hands it to (with `t`,
        the time the step emitted)."""
        self.seq = seq
        t = time.perf_counter() if t is None else t
        if isinstance(chunk, BaseException):
            self.deliver(chunk)
        elif chunk:
            if self.stage.stopped:  # a step after the stop (none once the request has left): not its output
                return
            text = self.stage.push(chunk) if self.decode else ""
            ids = list(chunk)
            if self.stage.stopped:
                seq.cancel.set()  # retired at the end of this step (of the step in progress, from another thread)
                ids = ids[:self.stage.kept]  # the step's tokens past the one that completed the stop string: dropped
            self.tokens += len(ids)
            self.deliver(Step(t, ids, text, self.stage.stopped))
        else:
            tail = self.stage.finish() if self.decode else ""
            if self.stage.stopped:
                seq.stats.finish_reason = "stop"  # after the scheduler's "cancelled"
                seq.stats.new_tokens = self.tokens  # not the steps' tokens past the stop string (nor a step after)
            if tail:
                self.deliver(Step(t, [], tail, self.stage.stopped))
            self.deliver(END)


def blocking(tokenizer: Any, stops, text: bool = True) -> tuple[RequestOutput, queue.SimpleQueue]:
    """(the emit of a request read by a blocking caller, the queue its steps arrive on)."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    return RequestOutput(tokenizer, stops, events.put, text), events


def steps(events: queue.SimpleQueue, cancel: Callable[[], None]) -> Iterator[Step]:
    """The steps of a request until it ends; raises the error that ended it. Closing the iterator early calls
    `cancel` (the request's slot is free within a step)."""
    try:
        while True:
            ev = events.get()
            if ev is END:
                return
            if isinstance(ev, BaseException):
                raise ev
            yield ev
    finally:
        cancel()


def token_steps(seq: Any, events: queue.SimpleQueue, cancel: Callable[[], None]):
    """`BatchEngine.stream_tokens`'s steps: (new ids, stats) per step, the stop step last, once the request has left
    (its stats then final: finish_reason "stop")."""
    with contextlib.closing(steps(events, cancel)) as it:
        for step in it:
            if step.stopped:
                for _ in it:  # the end (a held-back tail carries no tokens)
                    pass
            if step.ids:
                yield step.ids, seq.stats
            if step.stopped:
                return


def result(gen_result: Any, seq: Any, events: queue.SimpleQueue, cancel: Callable[[], None]) -> Any:
    """A GenerationResult (`gen_result`: its class) of a request queued by `generate_batch`, once it has ended."""
    ids: list[int] = []
    text: list[str] = []
    for step in steps(events, cancel):
        ids += step.ids
        text.append(step.text)
    return gen_result("".join(text), ids, seq.prompt_ids.tolist(), seq.stats, seq.stats.finish_reason)
