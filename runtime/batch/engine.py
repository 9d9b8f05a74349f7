"""`BatchEngine`: the scheduler behind a thread, for several callers at once (the server, streaming clients).

    engine = BatchEngine(gen, max_batch=8)
    for ids, stats in engine.stream_tokens(prompt_ids, request=req): ...   # from any thread
    results = engine.generate_batch(["a", "b"], max_new_tokens=32)       # several prompts, one call

One Generator (one weights copy) whatever the batch. Requests join and leave at step boundaries; closing a
stream (or `cancel`) frees its slot within one step. `close()` (or `with engine:`) ends every request the engine
still holds with `EngineClosed`, and later calls raise it at once.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Mapping, Set as AbstractSet
from typing import Any, Iterator, Sequence as Seq

from specrt.core.errors import EngineClosed, InvalidArgument
from specrt.core.tokenizer import TextStage
from specrt.runtime.batch.scheduler import DEFAULT_PREFILL_CHUNK, Scheduler
from specrt.runtime.batch.sequence import BatchSequence
from specrt.runtime.request import GenerationRequest
from specrt.runtime.stats import GenerationStats

END = object()


class BatchEngine:
    def __init__(self, gen, max_batch: int = 8, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 packed: bool | None = None) -> None:
        from specrt.runtime.batch.memory import check_max_batch

        self.gen = gen
        check_max_batch(gen, max_batch)  # before anything is preallocated
        self.scheduler = Scheduler(gen, max_batch, prefill_chunk, packed)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._ids = itertools.count()
        self._closed = False
        self._door = threading.Lock()  # queuing and closing exclude each other: nothing is queued after close
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="specrt-batch", daemon=True)
        self._thread.start()

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    def close(self) -> None:
        """Stop the engine: requests still running or queued end with EngineClosed (their callers' iterators and
        generate_batch calls raise it), later calls raise it at once. Safe to call twice."""
        with self._door:
            self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)  # a step in progress ends first; its thread then ends every request left

    def __enter__(self) -> "BatchEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _queue(self, seqs: list[BatchSequence]) -> None:
        with self._door:
            if self._closed:
                raise EngineClosed("this BatchEngine is closed: create a new one (Generator.engine())")
            self._inbox.put(seqs)
        self._wake.set()

    def _loop(self) -> None:
        try:
            self._serve()
        finally:  # closed (or the thread failed): nobody waits forever on a request it held
            self._end_all(EngineClosed("the BatchEngine was closed before this request finished"))

    def _end_all(self, exc: BaseException, inbox: bool = True) -> None:
        queued = []
        while inbox:
            try:
                queued += self._inbox.get_nowait()
            except queue.Empty:
                break
        self.scheduler.abort_all(exc, queued)

    def _serve(self) -> None:
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
                self._end_all(exc, inbox=False)
                sched.targets.used = 0
                if sched.drafts is not None:
                    sched.drafts.used = 0

    def submit(self, prompt, request: GenerationRequest | None = None, **options: Any):
        """Queue one request; returns (BatchSequence, event queue). Events: (time.perf_counter(), new ids) per step,
        then `END` (the stats are complete) or the exception that ended the request."""
        seq, events = self._sequence(prompt, request, **options)
        self._queue([seq])
        return seq, events

    def _sequence(self, prompt, request: GenerationRequest | None = None, **options: Any):
        """A checked request, not yet queued: (BatchSequence, its event queue)."""
        if self._closed:
            raise EngineClosed("this BatchEngine is closed: create a new one (Generator.engine())")
        max_new = options.pop("max_new_tokens", None)
        req = self.gen.request("submit", max_new, request, **options)
        method = req.method or self.gen.default_method
        if req.constraint is not None:  # structured output runs on the one-request loop (runtime/constrained.py)
            raise InvalidArgument("a constraint (response_format) is not supported with batching yet: serve without "
                                  "--max-batch for structured output")
        if method not in self.scheduler.methods:
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
        seq = BatchSequence(next(self._ids), ids, req, method, max_k, emit, stats, started=time.perf_counter())
        return seq, events

    def batchable(self, request: GenerationRequest) -> bool:
        """Whether `request` (resolved) runs on the batch: its method is batched and it has no constraint, no
        penalty, logit_bias or logprobs (those run on the one-request loop, runtime/logits_processors.py)."""
        return request.constraint is None and not request.logits_params.active \
            and (request.method or self.gen.default_method) in self.scheduler.methods

    def stream_tokens(self, prompt, max_new_tokens: int | None = None, *, request: GenerationRequest | None = None,
                      **options: Any) -> Iterator[tuple[list[int], GenerationStats]]:
        """Like `Generator.stream_tokens`: (new token ids, stats) per step, ending with the step whose text reaches a
        stop string (finish_reason "stop"). Closing the iterator cancels.
        A request the batch does not run (a constraint, penalties or logprobs, a method such as medusa) runs on the
        Generator's
        one-request loop instead, beside the batch (one at a time among themselves)."""
        req = self.gen.request("stream_tokens", max_new_tokens, request, **options)
        if not self.batchable(req):
            yield from self.gen.stream_tokens(prompt, request=req)
            return
        seq, events = self.submit(prompt, req)
        stage = TextStage(self.gen.tokenizer, req.stop) if req.stop else None  # as Generator.stream_tokens
        with contextlib.closing(self.events(seq, events)) as steps:
            for _, chunk in steps:
                if stage is not None and chunk:
                    stage.push(chunk)
                    if stage.stopped:
                        seq.stats.finish_reason = "stop"
                if stage is not None and stage.stopped:  # leaves at the end of this step: its END comes next
                    seq.cancel.set()
                    self._wake.set()
                    with contextlib.suppress(Exception):
                        for _ in steps:  # a step of tokens after the stop, if any: not its output
                            pass
                    seq.stats.finish_reason = "stop"  # after the scheduler's "cancelled"
                yield chunk, seq.stats
                if stage is not None and stage.stopped:
                    return
            if stage is not None:
                stage.finish()
                if stage.stopped:
                    seq.stats.finish_reason = "stop"

    def events(self, seq: BatchSequence, events: queue.SimpleQueue) -> Iterator[tuple[float, list[int]]]:
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
                       request: GenerationRequest | None = None, requests: Seq | None = None, **options: Any) -> list:
        """Generate for several prompts at once (batched); returns one GenerationResult per prompt, in order.
        `prompts`: a list (or any ordered iterable) of texts or token-id lists; a bad one is named by its index.
        `requests`: one GenerationRequest per prompt instead of one for all (e.g. the n choices of a request, each
        with its seed: runtime/choices.py)."""
        from specrt.runtime.generator import GenerationResult

        if (isinstance(prompts, (str, bytes, bytearray, Mapping, AbstractSet))
                or not hasattr(prompts, "__iter__")):
            raise InvalidArgument(f"prompts must be a list of prompts (texts or token-id lists), got "
                                  f"{type(prompts).__name__}; for one prompt use generate or stream_tokens")
        prompts = list(prompts)
        if requests is None:
            reqs = [self.gen.request("generate_batch", max_new_tokens, request, **options)] * len(prompts)
        else:
            requests = list(requests)
            if len(requests) != len(prompts):
                raise InvalidArgument(f"requests must hold one request per prompt: {len(requests)} for "
                                      f"{len(prompts)}")
            reqs = [self.gen.request("generate_batch", max_new_tokens, r) for r in requests]
        if not all(self.batchable(r) for r in reqs):  # see stream_tokens: the one-request loop, prompt after prompt
            return [self.gen.generate(p, request=r) for p, r in zip(prompts, reqs)]
        subs = []
        for i, (p, r) in enumerate(zip(prompts, reqs)):
            try:
                subs.append(self._sequence(p, r))
            except InvalidArgument as exc:
                raise InvalidArgument(f"prompt {i}: {exc}") from None
        watches = [_StopWatch(seq, self.gen.tokenizer) for seq, _ in subs]  # before queuing: it sees every step
        self._queue([seq for seq, _ in subs])  # queued together: admitted in one step, prefilled in one pass
        out = []
        for (seq, events), watch in zip(subs, watches):
            ids = [t for _, chunk in self.events(seq, events) for t in chunk]
            text = watch.finish(ids)
            if watch.stage.stopped:
                seq.stats.finish_reason = "stop"
            out.append(GenerationResult(text, ids, seq.prompt_ids.tolist(), seq.stats, seq.stats.finish_reason))
        return out

    def stream(self, prompt, max_new_tokens: int | None = None, *, request: GenerationRequest | None = None,
               **options: Any) -> Iterator[str]:
        """Like `Generator.stream`: text pieces, cut before the first stop string."""
        req = self.gen.request("stream", max_new_tokens, request, **options)
        stage = TextStage(self.gen.tokenizer, req.stop)
        with contextlib.closing(self.stream_tokens(prompt, request=req)) as steps:
            for ids, _ in steps:
                piece = stage.push(ids)
                if piece:
                    yield piece
                if stage.stopped:
                    return
        tail = stage.finish()
        if tail:
            yield tail


class _StopWatch:
    """A request's stop strings, watched on the engine's thread as each step emits (so a request that reaches one
    leaves at the end of that step, whenever its caller reads it): the text cut before the first stop string
    (the shared `TextStage`), and no tokens after that step's."""

    def __init__(self, seq: BatchSequence, tokenizer) -> None:
        self.stage = TextStage(tokenizer, seq.request.stop)
        self.text: list[str] = []
        self._emit = seq.emit
        self.watched = bool(seq.request.stop)  # without stop strings nothing is decoded on the engine's thread
        if self.watched:
            seq.emit = self._on_step

    def _on_step(self, chunk, seq: BatchSequence) -> None:
        if isinstance(chunk, list) and chunk:
            if self.stage.stopped:  # steps after the stop (none once the request has left): not its output
                return
            self.text.append(self.stage.push(chunk))
            if self.stage.stopped:
                seq.cancel.set()  # retired at the end of this step
        self._emit(chunk, seq)

    def finish(self, ids: list[int]) -> str:
        """The text, once the request has ended with `ids`."""
        if not self.watched:  # decoded here, at once
            self.text.append(self.stage.push(ids))
        self.text.append(self.stage.finish())
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
