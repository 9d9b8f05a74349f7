"""Several choices in one request: `n > 1`, several prompts on /v1/completions, or both.

Choice `c` of prompt `p` has index `p * n + c` (OpenAI's order). Each choice is decoded as a sequence of its own:
* sampled: choice i's request is the request with seed `choice_seed(seed, i)` = (seed + i) mod 2**63 (vLLM's rule;
  no seed: fresh entropy per choice), so the same seed gives the same n choices, and choice 0 is what the same
  request with n = 1 gives;
* greedy: every choice of a prompt would be the same text, so the prompt is decoded once and its n choices are
  copies (vLLM returns n identical choices too; usage counts each choice's tokens).

`ChoiceRun` decodes the jobs on the server's slots: up to one slot per job, at most all slots. With `--max-batch`
the slots are rows of one batch, so the choices decode together (each prefills the prompt: the batch pool has no
shared prefill rows yet); without it they run on the slots there are (one slot: one after the other). A lane keeps
its slot from one job to the next, so a request that got a first slot always finishes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any, Optional

from specrt.runtime.request import MAX_CHOICES
from specrt.serve.errors import bad_request
from specrt.serve.slots import QueueFull, RequestStream, ServerShuttingDown
from specrt.serve.worker import Done, Job


def check_n(n: int, prompts: int) -> int:
    """n within [1, MAX_CHOICES], and n x prompts too (the choices of one request)."""
    if n < 1 or n > MAX_CHOICES:
        raise bad_request(f"n must be in [1, {MAX_CHOICES}], got {n}", "n")
    if n * prompts > MAX_CHOICES:
        raise bad_request(f"{prompts} prompts x n={n} = {n * prompts} choices; at most {MAX_CHOICES} choices per "
                          "request (split it)", "n" if n > 1 else "prompt")
    return n


def plan_jobs(prepared: list[Any], n: int) -> tuple[list[Job], list[int]]:
    """(jobs to decode, the job of each choice index): one job per choice, or per prompt when greedy. `prepared`:
    one PreparedRequest per prompt (runtime/prepared.py); a choice's is derived from it, not checked again."""
    jobs: list[Job] = []
    of: list[int] = []
    for p in prepared:
        if p.request.sampling.greedy:
            jobs.append(Job.of(p))
            of += [len(jobs) - 1] * n
            continue
        for i in range(n):
            jobs.append(Job.of(p.for_choice(i)))
            of.append(len(jobs) - 1)
    return jobs, of


class _Keep:
    """Stands in for the admission queue in a lane's streams: the slot stays with the lane between its jobs; once
    the lane has ended, a slot handed back goes to the queue."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.slot, self.closed = pool, None, False

    def release(self, slot: Any) -> None:
        if self.closed:
            self.pool.release(slot)
        else:
            self.slot = slot

    def close(self) -> None:
        self.closed = True
        if self.slot is not None:
            slot, self.slot = self.slot, None
            self.pool.release(slot)


class ChoiceRun:
    """The jobs of one request on the slot pool; `next()` gives (job index, event) in arrival order."""

    def __init__(self, service: Any, jobs: list[Job], observers: list[Any]) -> None:
        self.service, self.jobs, self.observers = service, jobs, observers
        self.pending = collections.deque(range(len(jobs)))
        self.events: asyncio.Queue = asyncio.Queue()
        self.runs: list[RequestStream] = []
        self.tasks: list[asyncio.Future] = []
        self.stopped = False
        self.done = 0

    def start(self, first_slot: Any) -> None:
        lanes = min(len(self.jobs), self.service.pool.size)
        self.tasks = [asyncio.ensure_future(self._lane(first_slot))]
        self.tasks += [asyncio.ensure_future(self._lane(None)) for _ in range(lanes - 1)]

    async def _lane(self, slot: Optional[Any]) -> None:
        pool = self.service.pool
        if slot is None:
            try:
                slot = await pool.acquire()
            except (QueueFull, ServerShuttingDown):
                return  # the lanes that have a slot decode this lane's share (after a shutdown: each ends at once)
        keep = _Keep(pool)
        keep.slot = slot
        try:
            while self.pending and not self.stopped:
                j = self.pending.popleft()
                slot, keep.slot = keep.slot, None
                try:
                    run = self.service.start(keep, slot, self.jobs[j], self.observers[j])
                except Exception as exc:  # noqa: BLE001 - it never started (its slot is back): its end is this error
                    self.events.put_nowait((j, Done("error", 0, None, exc)))  # (before: the request waited for ever)
                    continue
                self.runs.append(run)
                while True:
                    event = await run.next_event()
                    self.events.put_nowait((j, event))
                    if isinstance(event, Done):
                        break
        finally:
            keep.close()

    async def next(self) -> tuple[int, Any]:
        j, event = await self.events.get()
        if isinstance(event, Done):
            self.done += 1
        return j, event

    @property
    def finished(self) -> bool:
        return self.done == len(self.jobs)

    def stop(self) -> None:
        """Cancel what runs and what waits (the client left, or one choice failed)."""
        self.stopped = True
        for run in self.runs:
            run.cancel()
        for task in self.tasks:
            task.cancel()


def job_view(prep: Any, job: Job) -> Any:
    """`prep` as seen by the metrics of one of its jobs (its own prompt)."""
    return dataclasses.replace(prep, job=job)
