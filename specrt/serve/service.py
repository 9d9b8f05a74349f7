"""Requests -> generation jobs -> OpenAI responses (JSON or server-sent events).

Validation happens before a slot is taken; prompt tokenization runs in a thread, not on the loop. Chat
templates render in their own small pool (`RENDER_THREADS`), each render bounded in time and size
(`specrt.runtime.template_bounds`: a hit bound is a 400), so slow templates never hold the threads that
plain completions use.
A request with a `response_format` is admitted first (a place in the queue, or 429 at once), then its schema is
compiled on the compile threads (runtime/constraint_pool.py: bounded in number, stack and time; never the threads
that serve plain requests), and only then does it wait for a slot: a compiling request holds no slot.
A request waits for a slot in the bounded queue (429 beyond it); once it has one, the first event
(first token or an error) is awaited before the response starts, so argument errors are real 400s
even for `stream: true`.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from specrt.runtime.chat_template import ChatFormatter
from specrt.serve.config import ServeConfig
from specrt.serve.disconnect import collect_or_gone, wait_disconnect
from specrt.serve.errors import APIError, error_body
from specrt.serve.failures import constraint_failure, failure, shutting_down
from specrt.serve.logprobs import shaped
from specrt.serve.metrics import ServerMetrics
from specrt.serve.requests import Prepared, prepare_chat, prepare_completion
from specrt.serve.engine_stream import Producers
from specrt.serve.slots import AdmissionQueue, QueueFull, RequestStream, ServerShuttingDown
from specrt.serve.sse import DONE, EventStream, sse
from specrt.serve.worker import Delta, Done


RENDER_THREADS = 2  # chat-template renders at a time (each bounded: RenderBounds.max_seconds)
COMPILE_THREADS = 2  # response_format compiles at a time (as many as runtime/constraint_pool.py's threads)


def spec_stats(stats: Any) -> dict[str, Any]:
    if stats is None:
        return {"acceptance_rate": 0.0, "mean_accepted_tokens": 0.0, "drafted_tokens": 0, "accepted_tokens": 0,
                "verify_steps": 0, "num_speculative_tokens": 0, "method": None, "constraint": None,
                "forced_tokens": 0, "forced_accepted": 0}
    return {"acceptance_rate": stats.acceptance_rate, "mean_accepted_tokens": stats.mean_accepted_tokens,
            "drafted_tokens": stats.drafted_tokens, "accepted_tokens": stats.accepted_tokens,
            "verify_steps": stats.verify_steps, "num_speculative_tokens": k_used(stats),
            "method": stats.method, "constraint": stats.constraint or None,
            "forced_tokens": stats.forced_tokens, "forced_accepted": stats.forced_accepted}


def k_used(stats: Any) -> int:
    """The largest k any step of the request drafted with (docs/serving.md "Speculative stats"): a request's k is an
    upper bound, a step drafts fewer near the end of the output or when its policy or the batch plan says so."""
    return max(stats.k_history, default=0)


def usage(prompt_tokens: int, completion_tokens: int, stats: Any = None,
          cached: Optional[int] = None) -> dict[str, Any]:
    """OpenAI's usage object; with the request's stats (or `cached`), `prompt_tokens_details.cached_tokens` (the
    prompt tokens the prefix cache supplied: runtime/batch/prefix_cache.py)."""
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if stats is not None:
        cached = stats.cached_tokens
    if cached is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


def _constrained(body: Any) -> bool:
    """Whether a request has a response_format to check and compile: its preparation (the schema's bounds, in
    Python) then runs on the compile pool too, never beside plain requests' tokenization."""
    return body.response_format is not None and body.response_format.type != "text"


class Service:
    """`generators`: one slot each (a worker thread each); or `engine` (a BatchEngine): its max_batch slots are the
    batch's rows, its requests' streams fed by the engine's thread (engine_stream.py)."""

    def __init__(self, generators: list[Any], config: ServeConfig, engine: Optional[Any] = None) -> None:
        self.config = config
        # for tokenization and limits: every slot loads the same bundle
        self.generator = engine.gen if engine is not None else generators[0]
        slots = list(range(engine.max_batch)) if engine is not None else generators
        self.pool = AdmissionQueue(slots, config.max_queue)  # the one queue a request waits in
        self.producers = Producers(generators, engine)
        self.metrics = ServerMetrics(self.pool, self.generator.max_draft_tokens)
        self.chat = ChatFormatter.from_manifest(self.generator.manifest)
        self.render_pool = ThreadPoolExecutor(max_workers=RENDER_THREADS, thread_name_prefix="specrt-chat")
        # constrained requests' checks, and waits on the compile threads (runtime/constraint_pool.py): never the
        # default executor, which tokenizes every plain request
        self.compile_pool = ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix="specrt-compile-wait")
        self.live: set[RequestStream] = set()  # the generations running (`shut_down` ends them)

    def shut_down(self) -> None:
        """The graceful shutdown's time is up (on the loop): every request still running or waiting for a slot ends
        now with a 503 (an error event on a stream), and no later one starts."""
        error = ServerShuttingDown("the server is shutting down: its grace period for running requests is over")
        self.pool.close(error)
        for stream in list(self.live):
            stream.fail(error)

    def close(self) -> None:
        self.producers.close()
        self.render_pool.shutdown(wait=False, cancel_futures=True)
        self.compile_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------- routes
    async def completion(self, request: Request, body: Any) -> Response:
        arrived = time.perf_counter()
        pool = self.compile_pool if _constrained(body) else None  # None: the default executor
        prep = await asyncio.get_running_loop().run_in_executor(pool, prepare_completion, body, self.generator,
                                                                self.config)
        return await self._respond(request, prep, arrived, "/v1/completions")

    async def chat_completion(self, request: Request, body: Any) -> Response:
        arrived = time.perf_counter()
        prep = await asyncio.get_running_loop().run_in_executor(
            self.compile_pool if _constrained(body) else self.render_pool, prepare_chat, body, self.generator,
            self.config, self.chat)
        return await self._respond(request, prep, arrived, "/v1/chat/completions")

    # -------------------------------------------------------------------------------- internals
    def start(self, pool: Any, slot: Any, job: Any, observe: Any) -> RequestStream:
        """`job` running on `slot` (taken from `pool`, given back to it when the generation is over)."""
        stream = RequestStream(lambda: (self.live.discard(stream), pool.release(slot)), observe)
        if self.pool.closed is not None:  # a choice's next job after `shut_down`: it ends at once
            stream.deliver(Done("error", 0, None, self.pool.closed))
            return stream
        self.live.add(stream)
        try:
            self.producers.start(slot, job, stream)
        except BaseException:
            stream.release()  # a request that never started gives its slot back (else the next one waits forever)
            raise
        return stream

    async def _acquire(self, request: Request, admitted: bool = False) -> Optional[Any]:
        """A free slot, or None when the client left while waiting in the queue."""
        acquire = asyncio.ensure_future(self.pool.acquire(admitted))
        gone = asyncio.ensure_future(wait_disconnect(request))
        try:
            await asyncio.wait({acquire, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not acquire.done():
            acquire.cancel()
            await asyncio.gather(acquire, return_exceptions=True)
            if acquire.cancelled():
                return None
        try:
            return acquire.result()
        except QueueFull as exc:
            raise self._busy(exc) from None
        except ServerShuttingDown as exc:
            raise shutting_down(exc) from None

    def _observer(self, prep: Prepared, arrived: float, endpoint: str, state: Optional[dict] = None):
        m = self.metrics
        last: list[Optional[float]] = [None]

        def observe(event: Any) -> None:
            if isinstance(event, Delta) and event.tokens:
                if last[0] is None:
                    m.ttft.observe(event.t - arrived)
                else:
                    m.observe_step(event.t - last[0], event.tokens)
                last[0] = event.t
            elif isinstance(event, Done):
                if state is not None:  # for the access log line
                    state["completion_tokens"] = event.completion_tokens
                m.observe_done(event.finish_reason, len(prep.job.prompt_ids), event.completion_tokens, event.stats)
                m.e2e.observe(time.perf_counter() - arrived)
                if event.finish_reason == "cancelled":
                    m.cancelled.labels(endpoint).inc()

        return observe

    async def _compile(self, spec: Any, tools: bool = False) -> None:
        """Admitted (a queue place, or 429 now), compile `spec` on the compile threads; the slot's generator then
        takes a copy of the compiled constraint from the cache (ConstraintCompiler.compile)."""
        from specrt.runtime.constraint import ConstraintError

        try:
            self.pool.admit()
        except QueueFull as exc:
            raise self._busy(exc) from None
        except ServerShuttingDown as exc:
            raise shutting_down(exc) from None
        try:
            await asyncio.get_running_loop().run_in_executor(self.compile_pool, self.generator.compile_constraint, spec)
        except ConstraintError as exc:
            raise constraint_failure(exc, tools) from None
        finally:
            self.pool.unadmit()

    def _busy(self, exc: QueueFull) -> APIError:
        return APIError(429, f"server busy: {exc}; retry later", type="rate_limit_error", code="queue_full",
                        headers={"Retry-After": str(self.config.retry_after_s)})

    async def _respond(self, request: Request, prep: Prepared, arrived: float, endpoint: str) -> Response:
        spec = prep.job.request.constraint  # response_format, or a forced tool call's parameters schema
        if spec is not None:
            await self._compile(spec, tools=prep.tools is not None)
        if prep.several:  # n > 1, several prompts, or tool calls to parse
            from specrt.serve.choice_responses import respond_choices

            return await respond_choices(self, request, prep, arrived, endpoint)
        slot = await self._acquire(request, admitted=spec is not None)
        if slot is None:
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        run = self.start(self.pool, slot, prep.job, self._observer(prep, arrived, endpoint,
                                                                    request.scope.setdefault("state", {})))
        first = await run.next_event()
        if isinstance(first, Done) and first.error is not None:
            raise failure(first)
        if prep.stream:
            return EventStream(self._events(run, first, prep), run.cancel)
        done, collected = await collect_or_gone(request, self._collect(run, first), run.cancel)
        if not done:
            return Response(status_code=499)
        text, done, lp = collected
        if done.error is not None:
            raise failure(done)
        return JSONResponse(self._final_body(prep, text, done, lp))

    async def _collect(self, run: RequestStream, first: Any) -> tuple[str, Done, list]:
        parts, lp = [], []
        event = first
        while not isinstance(event, Done):
            parts.append(event.text)
            lp.extend(event.logprobs)
            event = await run.next_event()
        return "".join(parts), event, lp

    def _final_body(self, prep: Prepared, text: str, done: Done, lp: list) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": done.finish_reason,
                                  "logprobs": shaped(lp, prep.chat) if prep.job.request.logprobs is not None else None}
        if prep.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(prep, chunk=False), "choices": [choice],
                "usage": usage(len(prep.job.prompt_ids), done.completion_tokens, done.stats),
                "speculative_stats": spec_stats(done.stats)}

    def _head(self, prep: Prepared, chunk: bool) -> dict[str, Any]:
        obj = ("chat.completion.chunk" if chunk else "chat.completion") if prep.chat else "text_completion"
        return {"id": prep.request_id, "object": obj, "created": prep.created, "model": self.config.served_model_name}

    def _chunk(self, prep: Prepared, text: Optional[str], finish: Optional[str] = None,
               role: bool = False, logprobs: Optional[dict] = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": finish}
        if prep.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        body = {**self._head(prep, chunk=True), "choices": [choice]}
        if prep.include_usage:  # as OpenAI: null on every chunk but the last one's
            body["usage"] = None
        return body

    async def _events(self, run: RequestStream, first: Any, prep: Prepared) -> AsyncIterator[bytes]:
        if prep.chat:
            yield sse(self._chunk(prep, "", role=True))
        event, offset = first, 0
        while not isinstance(event, Done):
            if event.text or event.logprobs:
                lp = shaped(event.logprobs, prep.chat, offset) if event.logprobs else None
                offset += sum(len(e["token"]) for e in event.logprobs)
                yield sse(self._chunk(prep, event.text, logprobs=lp))
            event = await run.next_event()
        if event.error is not None:
            err = failure(event)
            yield sse(error_body(err.message, err.type, err.param, err.code))
        else:
            last = self._chunk(prep, None if prep.chat else "", event.finish_reason)
            last["speculative_stats"] = spec_stats(event.stats)
            yield sse(last)
            if prep.include_usage:
                yield sse({**self._head(prep, chunk=True), "choices": [],
                           "usage": usage(len(prep.job.prompt_ids), event.completion_tokens, event.stats)})
        yield DONE
