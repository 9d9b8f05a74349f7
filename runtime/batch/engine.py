"""`BatchEngine`: the scheduler behind a thread, for several callers at once (the server, streaming clients).

    engine = BatchEngine(gen, max_batch=8)
    for ids, stats in engine.stream_tokens(prompt_ids, request=req): ...   # from any thread
    results = engine.generate_batch(["a", "b"], max_new_tokens=32)       # several prompts, one call

One Generator (one weights copy) whatever the batch. Requests join and leave at step boundaries; closing a
stream (or `cancel`) frees its slot within one step.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from typing import Any, Iterator, Sequence as Seq

from specrt.core.tokenizer import IncrementalDecoder, StopText, text_pieces
from specrt.runtime.batch.scheduler import DEFAULT_PREFILL_CHUNK, Scheduler
from specrt.runtime.batch.sequence import Sequence
from specrt.runtime.request import GenerationRequest
from specrt.runtime.stats import GenerationStats

END = object()


class BatchEngine:
    def __init__(self, gen, max_batch: int = 8, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 packed: bool | None = None) -> None:
        self.gen = gen
        self.scheduler = Scheduler(gen, max_batch, prefill_chunk, packed)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._ids = itertools.count()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="specrt-batch", daemon=True)
        self._thread.start()

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        sched = self.scheduler
        while not self._closed:
            while True:
                try:
                    for seq in self._inbox.get_nowait():  # methods were checked by _sequence
                        sched.add(seq)
                except queue.Empty:
                    break
            if not sched.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                sched.step()
            except BaseException as exc:  # noqa: BLE001 - a failed step ends every request in it with the error
                self._error = exc
                for s in list(sched.running) + list(sched.prefilling) + list(sched.waiting):
                    s.emit(exc, s)
                sched.running, sched.prefilling = [], []
                sched.waiting.clear()
                sched.targets.used = 0
                if sched.drafts is not None:
                    sched.drafts.used = 0

    def submit(self, prompt, request: GenerationRequest | None = None, **options: Any):
        """Queue one request; returns (Sequence, event queue). Events: (time.perf_counter(), new token ids) per step,
        then `END` (the stats are complete) or the exception that ended the request."""
        seq, events = self._sequence(prompt, request, **options)
        self._inbox.put([seq])
        self._wake.set()
        return seq, events

    def _sequence(self, prompt, request: GenerationRequest | None = None, **options: Any):
        """A checked request, not yet queued: (Sequence, its event queue)."""
        max_new = options.pop("max_new_tokens", None)
        req = self.gen.request("submit", max_new, request, **options)
        method = req.method or self.gen.default_method
        if req.constraint is not None:  # structured output runs on the one-request loop (runtime/constrained.py)
            from specrt.core.errors import InvalidArgument

            raise InvalidArgument("a constraint (response_format) is not supported with batching yet: serve without "
                                  "--max-batch for structured output")
        if method not in self.scheduler.methods:
            from specrt.core.errors import InvalidArgument

            raise InvalidArgument(f"method {method!r} is not available with batching; choose one of "
                                  f"{', '.join(self.scheduler.methods)}")
        ids = self.gen.encode_prompt(prompt)
        self.gen.check_room(ids, req)
        k = req.num_speculative_tokens
        max_k = self.gen.max_draft_tokens if k == "auto" else k
        events: queue.SimpleQueue = queue.SimpleQueue()

        def emit(chunk, seq):
            if isinstance(chunk, BaseException):
                events.put(chunk)
            elif chunk:
                events.put((time.perf_counter(), chunk))
            else:
                events.put(END)

        stats = GenerationStats(method=method, backend=self.gen.backend, prompt_tokens=int(ids.size),
                                provider="batched", context_limited=req.max_new_tokens > self.gen.max_seq_len - ids.size)
        seq = Sequence(next(self._ids), ids, req, method, max_k, emit, stats, started=time.perf_counter())
        return seq, events

    def batchable(self, request: GenerationRequest) -> bool:
        """Whether `request` (resolved) runs on the batch: its method is batched and it has no constraint, no
        penalty, logit_bias or logprobs (those run on the one-request loop, runtime/logits_processors.py)."""
        return request.constraint is None and not request.logits_params.active \
            and (request.method or self.gen.default_method) in self.scheduler.methods

    def stream_tokens(self, prompt, max_new_tokens: int | None = None, *, request: GenerationRequest | None = None,
                      **options: Any) -> Iterator[tuple[list[int], GenerationStats]]:
        """Like `Generator.stream_tokens`: (new token ids, stats) per step. Closing the iterator cancels.
        A request the batch does not run (a constraint, penalties or logprobs, a method such as medusa) runs on the Generator's
        one-request loop instead, beside the batch (one at a time among themselves)."""
        req = self.gen.request("stream_tokens", max_new_tokens, request, **options)
        if not self.batchable(req):
            yield from self.gen.stream_tokens(prompt, request=req)
            return
        seq, events = self.submit(prompt, req)
        with contextlib.closing(self.events(seq, events)) as steps:
            for _, chunk in steps:
                yield chunk, seq.stats

    def events(self, seq: Sequence, events: queue.SimpleQueue) -> Iterator[tuple[float, list[int]]]:
        """(time the step emitted it, new token ids) per step of a submitted request until it ends; raises the
        error that ended it. Closing the iterator early cancels the request (its slot is free within a step)."""
        try:
            while True:
                ev = events.get()
                if ev is END:
                    return
                if isinstance(ev, BaseException):
                    raise ev
                yield ev
        finally:
            seq.cancel.set()
            self._wake.set()

    def generate_batch(self, prompts: Seq, max_new_tokens: int | None = None, *,
                       request: GenerationRequest | None = None, **options: Any) -> list:
        """Generate for several prompts at once (batched); returns one GenerationResult per prompt, in order."""
        from specrt.runtime.generator import GenerationResult

        if isinstance(prompts, (str, bytes, bytearray)) or not hasattr(prompts, "__iter__"):
            from specrt.core.errors import InvalidArgument

            raise InvalidArgument(f"prompts must be a list of prompts (texts or token-id lists), got "
                                  f"{type(prompts).__name__}; for one prompt use generate or stream_tokens")
        prompts = list(prompts)
        req = self.gen.request("generate_batch", max_new_tokens, request, **options)
        if not self.batchable(req):  # see stream_tokens: the one-request loop, prompt after prompt
            return [self.gen.generate(p, request=req) for p in prompts]
        subs = [self._sequence(p, req) for p in prompts]
        watches = [_StopWatch(seq, self.gen.tokenizer) for seq, _ in subs]  # before queuing: it sees every step
        self._inbox.put([seq for seq, _ in subs])  # queued together: admitted in one step, prefilled in one pass
        self._wake.set()
        out = []
        for (seq, events), watch in zip(subs, watches):
            ids = [t for _, chunk in self.events(seq, events) for t in chunk]
            text = watch.finish(ids)
            if watch.stopped:
                seq.stats.finish_reason = "stop"
            out.append(GenerationResult(text, ids, seq.prompt_ids.tolist(), seq.stats, seq.stats.finish_reason))
        return out

    def stream(self, prompt, max_new_tokens: int | None = None, **options: Any) -> Iterator[str]:
        return text_pieces(self.gen.tokenizer, (ids for ids, _ in self.stream_tokens(prompt, max_new_tokens,
                                                                                    **options)))


class _StopWatch:
    """A request's stop strings, watched on the engine's thread as each step emits (so a request that reaches one
    leaves at the end of that step, whenever its caller reads it): the text cut before the first stop string, and
    no tokens after that step's."""

    def __init__(self, seq: Sequence, tokenizer) -> None:
        self.dec, self.stopper = IncrementalDecoder(tokenizer), StopText(seq.request.stop)
        self.text: list[str] = []
        self.stopped = False
        self._emit = seq.emit
        self.watched = bool(seq.request.stop)  # without stop strings nothing is decoded on the engine's thread
        if self.watched:
            seq.emit = self._on_step

    def _on_step(self, chunk, seq: Sequence) -> None:
        if isinstance(chunk, list) and chunk:
            if self.stopped:  # steps after the stop (none once the request has left): not its output
                return
            piece, self.stopped = self.stopper.push(self.dec.push(chunk))
            self.text.append(piece)
            if self.stopped:
                seq.cancel.set()  # retired at the end of this step
        self._emit(chunk, seq)

    def finish(self, ids: list[int]) -> str:
        """The text, once the request has ended with `ids`."""
        if not self.watched:  # decoded here, at once
            self.text.append(self.dec.push(ids))
        if not self.stopped:
            piece, self.stopped = self.stopper.push(self.dec.flush())
            self.text.append(piece if self.stopped else piece + self.stopper.flush())
        return "".join(self.text)


class EngineClient:
    """A Generator look-alike for one server slot: everything from the generator, except that generations run
    on the shared engine (so N slots batch together on one weights copy)."""

    def __init__(self, engine: BatchEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine.gen, name)

    @property
    def methods(self) -> list[str]:
        return self._engine.gen.methods  # the batched ones on the batch, the others on the one-request loop

    def stream_tokens(self, *args: Any, **kwargs: Any):
        return self._engine.stream_tokens(*args, **kwargs)
