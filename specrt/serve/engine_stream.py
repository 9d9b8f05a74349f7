"""The producers of a served request's `RequestStream` (slots.py): the batch engine's thread, or a worker thread.

`Producers.start(slot, job, stream)`:
* with `--max-batch`, a request the batch runs is queued on the `BatchEngine`, whose thread hands each step's ids
  to the loop with `call_soon_threadsafe`; there the request's output stage (runtime/batch/streams.py: the one
  detokenize / stop-string stage) turns it into a `Delta`: no thread per request or per slot;
* otherwise `worker.run_job` drives a Generator in a worker thread: the slot's own generator (one thread per
  generator, `--max-concurrency`), or, beside the batch, the engine's generator for a request the batch does not run
  (a constraint, penalties, logprobs, a method such as medusa): one side thread, those run one at a time anyway.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from specrt.runtime.batch.streams import END, RequestOutput
from specrt.serve.slots import RequestStream
from specrt.serve.worker import Delta, Done, Job, run_job


class Producers:
    def __init__(self, generators: list[Any], engine: Optional[Any] = None) -> None:
        self.engine = engine
        threads = 1 if engine is not None else len(generators)  # never one per batch slot
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="specrt-slot")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def start(self, slot: Any, job: Job, stream: RequestStream) -> None:
        engine = self.engine
        if engine is not None and engine.batchable(job.prepared):
            _on_engine(engine, job, stream)
            return
        gen = engine.gen if engine is not None else slot
        cancel = threading.Event()
        stream.stop = cancel.set
        future = asyncio.get_running_loop().run_in_executor(self.executor, run_job, gen, job, cancel, stream.emit)
        future.add_done_callback(lambda _: stream.release())  # in case run_job died before Done


def _on_engine(engine: Any, job: Job, stream: RequestStream) -> None:
    """Queue `job` on the engine. Its steps cross to the loop as they are (ids), and the request's output stage runs
    there: the engine's thread decodes nothing for it and goes on with the next step while the loop detokenizes (as
    vLLM's output handler); a request that reaches a stop string is cancelled from the loop."""
    tokens = [0]

    def deliver(ev: Any) -> None:  # on the loop
        seq = output.seq
        if ev is END:
            stream.deliver(Done(seq.stats.finish_reason or "length", tokens[0], seq.stats))
        elif isinstance(ev, BaseException):
            stream.deliver(Done("error", tokens[0], seq.stats, ev))
        else:
            tokens[0] += len(ev.ids)
            stream.deliver(Delta(ev.text, len(ev.ids), ev.t))

    output = RequestOutput(engine.gen.tokenizer, job.stop, deliver)

    def emit(chunk: Any, seq: Any) -> None:  # Sequence.emit, on the engine's thread
        try:
            stream.loop.call_soon_threadsafe(output, chunk, seq, time.perf_counter())
        except RuntimeError:  # the loop is closed (server shut down): nobody listens any more
            seq.cancel.set()

    try:
        seq, _ = engine.submit(job.prepared, output=emit, checked=True)  # resolved and judged once (`start`)
    except Exception as exc:  # noqa: BLE001 - a request the engine refuses (closed, a bad argument): its Done
        stream.deliver(Done("error", 0, None, exc))
        return
    stream.stop = lambda: engine.cancel(seq)
