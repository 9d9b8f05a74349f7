"""`BatchEngine`: the scheduler behind a thread, for several callers at once (the server, streaming clients).

    engine = BatchEngine(gen, max_batch=8)
    for ids, stats in engine.stream_tokens(prompt_ids, request=req): ...   # from any thread
    results = engine.generate_batch(["a", "b"], max_new_tokens=32)       # several prompts, one call

One Generator (one weights copy) whatever the batch. Requests join and leave at step boundaries; closing a
stream (or `cancel`) frees its slot within one step. Each request's output (the one detokenize / stop-string stage)
runs on this thread as its step emits: runtime/batch/streams.py. `close()` (or `with engine:`) ends every request the engine
still holds with `EngineClosed`, and later calls raise it at once.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Mapping, Set as AbstractSet
from typing import Any, Iterator, Sequence as Seq

from specrt.core.errors import EngineClosed, InvalidArgument
from specrt.runtime.prefix_budget import DEFAULT_PREFIX_CACHE_MB, check_budget_mb
from specrt.runtime.batch.scheduler import DEFAULT_PREFILL_CHUNK, Scheduler
from specrt.runtime.batch.sequence import BatchSequence
from specrt.runtime.batch import intake
from specrt.runtime.batch.streams import blocking, result, steps, token_steps
from specrt.runtime.prepared import PreparedRequest
from specrt.runtime.request import GenerationRequest
from specrt.runtime.results import GenerationResult
from specrt.runtime.stats import GenerationStats


class BatchEngine:
    def __init__(self, gen, max_batch: int = 8, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 packed: bool | None = None, prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB) -> None:
        """`prefix_cache_mb`: the prefix cache's memory budget in MiB, 0 = off (runtime/batch/prefix_cache.py)."""
        from specrt.runtime.batch.memory import check_max_batch

        self.gen = gen
        check_budget_mb(prefix_cache_mb)
        check_max_batch(gen, max_batch)  # before anything is preallocated
        self.scheduler = Scheduler(gen, max_batch, prefill_chunk, packed, prefix_cache_mb)
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
                    for seq in self._inbox.get_nowait():  # checked by the intake (intake.py)
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
                self._end_all(exc, inbox=False)  # Scheduler.abort_all frees every region

    def submit(self, prompt, request: GenerationRequest | None = None, *, output: Any = None, **options: Any):
        """Queue one request (a prompt and its options, or a PreparedRequest alone); returns (BatchSequence, event queue).
        Its steps go to `output` (a `streams.RequestOutput`: e.g. the server's per-request async stream; the queue is
        then None); without one, to the returned queue: `Step`s ((time, ids, ...) tuples: runtime/batch/streams.py),
        then `END` (the stats are complete) or the exception that ended the request (read them with `events`)."""
        seq, events = self._sequence(prompt, request, output=output, **options)
        self._queue([seq])
        return seq, events

    def cancel(self, seq: BatchSequence) -> None:
        """Stop a submitted request from any thread: it leaves the batch within one step (its end is then emitted)."""
        seq.cancel.set()
        self._wake.set()

    def _prepared(self, public: str, prompt, max_new_tokens: int | None, request: GenerationRequest | None,
                  options: dict) -> PreparedRequest:
        if self._closed:
            raise EngineClosed("this BatchEngine is closed: create a new one (Generator.engine())")
        return intake.prepared(self.gen, f"BatchEngine.{public}", prompt, max_new_tokens, request, options)

    def _sequence(self, prompt, request: GenerationRequest | None = None, *, output: Any = None, checked: bool = False,
                  **options: Any):
        """A request (a PreparedRequest, or a prompt and its options: prepared here) as a BatchSequence, not yet
        queued: (BatchSequence, its event queue); its steps go to `output` (its emit; the queue is then None), or to the
        queue (`streams.blocking`)."""
        prepared = self._prepared("submit", prompt, options.pop("max_new_tokens", None), request, options)
        if not checked and (why := intake.refusal(prepared, self.scheduler.methods, loop_only=False)):
            raise InvalidArgument(why)
        req, ids = prepared.request, prepared.prompt_ids
        k = req.num_speculative_tokens
        max_k = self.gen.max_draft_tokens if k == "auto" else k
        stats = GenerationStats(method=prepared.method, backend=self.gen.backend, prompt_tokens=int(ids.size),
                                provider="batched", context_limited=prepared.context_limited)
        events = None
        if output is None:
            output, events = blocking(self.gen.tokenizer, (), text=False)
        seq = BatchSequence(next(self._ids), ids, req, prepared.method, max_k, output, stats, started=time.perf_counter(),
                            stop_ids=req.stop_ids(self.gen.eos_ids))
        return seq, events

    def batchable(self, request: PreparedRequest) -> bool:
        """Whether a prepared request runs on the batch (else on the one-request loop: `intake.refusal` says why)."""
        return not intake.refusal(request, self.scheduler.methods)

    def stream_tokens(self, prompt, max_new_tokens: int | None = None, *, request: GenerationRequest | None = None,
                      **options: Any) -> Iterator[tuple[list[int], GenerationStats]]:
        """Like `Generator.stream_tokens`: (new token ids, stats) per step, ending with the token whose text completes
        a stop string (finish_reason "stop"). Closing the iterator cancels. `prompt` may be a PreparedRequest.
        A request the batch does not run (a constraint, penalties or logprobs, a method such as medusa) runs on the
        Generator's one-request loop instead, beside the batch (one at a time among themselves)."""
        prepared = self._prepared("stream_tokens", prompt, max_new_tokens, request, options)
        if not self.batchable(prepared):
            yield from self.gen.stream_tokens(prepared)
            return
        output, events = blocking(self.gen.tokenizer, prepared.stop, text=False)  # decoded only to find stop strings
        seq, _ = self._sequence(prepared, output=output, checked=True)
        self._queue([seq])
        yield from token_steps(seq, events, lambda: self.cancel(seq))

    def events(self, seq: BatchSequence, events) -> Iterator[tuple[float, list[int]]]:
        """(time the step emitted it, new token ids) per step of a request `submit` queued without an output, until
        it ends; raises the error that ended it. Closing the iterator early cancels the request (its slot is free
        within a step)."""
        for step in steps(events, lambda: self.cancel(seq)):
            yield step.t, step.ids

    def generate_batch(self, prompts: Seq, max_new_tokens: int | None = None, *,
                       request: GenerationRequest | None = None, requests: Seq | None = None, **options: Any) -> list:
        """Generate for several prompts at once (batched); returns one GenerationResult per prompt, in order.
        `prompts`: a list (or any ordered iterable) of texts or token-id lists (a bad one is named by its index), or
        of PreparedRequests alone. `requests`: one GenerationRequest per prompt instead of one for all."""
        if (isinstance(prompts, (str, bytes, bytearray, Mapping, AbstractSet))
                or not hasattr(prompts, "__iter__")):
            raise InvalidArgument(f"prompts must be a list of prompts (texts or token-id lists), got "
                                  f"{type(prompts).__name__}; for one prompt use generate or stream_tokens")
        prompts = list(prompts)
        if self._closed:
            raise EngineClosed("this BatchEngine is closed: create a new one (Generator.engine())")
        prepared = intake.prepare_batch(self.gen, prompts, max_new_tokens, request, requests, options)
        if not all(self.batchable(p) for p in prepared):  # see stream_tokens: the one-request loop, one after another
            return [self.gen.generate(p) for p in prepared]
        subs = []
        for p in prepared:
            output, events = blocking(self.gen.tokenizer, p.stop)  # the text cut at stop strings, on the engine thread
            subs.append((self._sequence(p, output=output, checked=True)[0], events))
        self._queue([seq for seq, _ in subs])  # queued together: admitted in one step, prefilled in one pass
        return [result(GenerationResult, seq, events, lambda s=seq: self.cancel(s)) for seq, events in subs]

    def stream(self, prompt, max_new_tokens: int | None = None, *, request: GenerationRequest | None = None,
               **options: Any) -> Iterator[str]:
        """Like `Generator.stream`: text pieces, cut before the first stop string (decoded on the engine thread)."""
        prepared = self._prepared("stream", prompt, max_new_tokens, request, options)
        if not self.batchable(prepared):
            yield from self.gen.stream(prepared)
            return
        output, events = blocking(self.gen.tokenizer, prepared.stop)
        seq, _ = self._sequence(prepared, output=output, checked=True)
        self._queue([seq])
        for step in steps(events, lambda: self.cancel(seq)):
            if step.text:
                yield step.text
