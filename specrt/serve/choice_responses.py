"""OpenAI responses of requests with several choices or with tools (choices.py runs them).

Non-streamed: one `choices` entry per choice index, `usage` summed over the choices (prompt tokens once per prompt),
`speculative_stats` summed over the decoded sequences, and with `logprobs` each choice its own sequence's (copies of
one greedy sequence: the same). Streamed: chunks carry their choice's `index` (and a step's logprobs, as the one-choice
stream); each choice ends with its own chunk carrying `finish_reason` and that sequence's `speculative_stats`. With
tools the answer is parsed once complete (tool_format.py), so a streamed tool request sends its content or its
`tool_calls` in one chunk at the end (with its logprobs, then the finish chunk).
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from specrt.serve.choices import ChoiceRun, job_view
from specrt.serve.errors import error_body
from specrt.serve.logprobs import shaped
from specrt.serve.sse import DONE, EventStream, sse
from specrt.serve.worker import Done


def merged_stats(stats: list[Any]) -> dict[str, Any]:
    """`service.spec_stats` of several sequences: counts summed, rates recomputed from the sums."""
    from specrt.serve.service import spec_stats

    ran = [s for s in stats if s is not None]
    out = spec_stats(ran[0] if ran else None)
    if len(ran) > 1:
        for key in ("drafted_tokens", "accepted_tokens", "verify_steps", "forced_tokens", "forced_accepted"):
            out[key] = sum(getattr(s, key) for s in ran)
        out["acceptance_rate"] = out["accepted_tokens"] / out["drafted_tokens"] if out["drafted_tokens"] else 0.0
        out["mean_accepted_tokens"] = (1 + out["accepted_tokens"] / out["verify_steps"]) if out["verify_steps"] \
            else 0.0
    return out


def _answer(prep: Any, text: str, finish: str) -> tuple[dict[str, Any], str]:
    """(message fields, finish_reason) of one chat choice: content, or tool calls parsed from the text."""
    if prep.tools is None:
        return {"content": text}, finish
    from specrt.serve.tool_format import calls_from_text

    content, calls = calls_from_text(prep.tools, text)
    if not calls:
        return {"content": text}, finish
    return {"content": content, "tool_calls": calls}, "tool_calls"


def _wants_logprobs(prep: Any) -> bool:
    return prep.job.request.logprobs is not None


def cached_tokens(prep: Any, stats_of: dict[int, Any]) -> int:
    """The prompt tokens the prefix cache supplied, each prompt counted once (as its tokens are in `usage`): those of
    its first choice's sequence (`stats_of`: job index -> its stats)."""
    firsts = {prep.choice_jobs[i] for i in range(0, len(prep.choice_jobs), prep.n)}
    return sum(stats_of[j].cached_tokens for j in firsts if stats_of.get(j) is not None)


def final_body(service: Any, prep: Any, texts: dict[int, str], dones: dict[int, Done],
               logprobs: dict[int, list]) -> dict[str, Any]:
    choices = []
    for c, j in enumerate(prep.choice_jobs):
        finish = dones[j].finish_reason
        choice: dict[str, Any] = {"index": c,
                                  "logprobs": shaped(logprobs.get(j, []), prep.chat) if _wants_logprobs(prep) else None}
        if prep.chat:
            fields, finish = _answer(prep, texts[j], finish)
            choice["message"] = {"role": "assistant", **fields}
        else:
            choice["text"] = texts[j]
        choice["finish_reason"] = finish
        choices.append(choice)
    from specrt.serve.service import usage

    completion = sum(dones[j].completion_tokens for j in prep.choice_jobs)
    cached = cached_tokens(prep, {j: d.stats for j, d in dones.items()})
    return {**service._head(prep, chunk=False), "choices": choices,
            "usage": usage(prep.prompt_tokens, completion, cached=cached),
            "speculative_stats": merged_stats([dones[j].stats for j in sorted(dones)])}


def _chunk(service: Any, prep: Any, index: int, delta: Optional[dict[str, Any]] = None, text: str = "",
           finish: Optional[str] = None, logprobs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish}
    if prep.chat:
        choice["delta"] = delta or {}
    else:
        choice["text"] = text
    body = {**service._head(prep, chunk=True), "choices": [choice]}
    if prep.include_usage:
        body["usage"] = None
    return body


async def _events(service: Any, run: ChoiceRun, first: tuple[int, Any], prep: Any,
                  state: dict[str, Any]) -> AsyncIterator[bytes]:
    from specrt.serve.service import failure, usage

    if prep.chat:
        for c in range(len(prep.choice_jobs)):
            yield sse(_chunk(service, prep, c, {"role": "assistant", "content": ""}))
    choices_of: dict[int, list[int]] = {}
    for c, j in enumerate(prep.choice_jobs):
        choices_of.setdefault(j, []).append(c)
    held: dict[int, list[str]] = {}  # with tools: each sequence's text until it is complete
    held_lp: dict[int, list] = {}  # with tools and logprobs: each sequence's entries, sent with its answer
    offsets: dict[int, int] = {}  # /v1/completions' text_offset: each sequence's token text so far
    completion = 0
    stats_of: dict[int, Any] = {}  # each finished sequence's stats (the usage's cached_tokens)
    j, event = first
    while True:
        if isinstance(event, Done):
            if event.error is not None:
                run.stop()
                err = failure(event)
                yield sse(error_body(err.message, err.type, err.param, err.code))
                break
            stats_of[j] = event.stats
            for c in choices_of[j]:
                completion += event.completion_tokens
                state["completion_tokens"] = completion  # for the access log line
                finish = event.finish_reason
                if prep.tools is not None:
                    fields, finish = _answer(prep, "".join(held.get(j, [])), finish)
                    if fields.get("tool_calls"):
                        fields["tool_calls"] = [{"index": k, **call} for k, call in enumerate(fields["tool_calls"])]
                    lp = shaped(held_lp.get(j, []), prep.chat) if _wants_logprobs(prep) else None
                    yield sse(_chunk(service, prep, c, {k: v for k, v in fields.items() if v is not None},
                                     logprobs=lp))
                last = _chunk(service, prep, c, None, "", finish)
                last["speculative_stats"] = merged_stats([event.stats])
                yield sse(last)
            if run.finished:
                if prep.include_usage:
                    yield sse({**service._head(prep, chunk=True), "choices": [],
                               "usage": usage(prep.prompt_tokens, completion,
                                              cached=cached_tokens(prep, stats_of))})
                break
        elif event.text or event.logprobs:
            if prep.tools is not None:
                held.setdefault(j, []).append(event.text)
                held_lp.setdefault(j, []).extend(event.logprobs)
            else:  # as the one-choice stream: a step's logprobs in its chunk, even while a stop string holds text
                lp = shaped(event.logprobs, prep.chat, offsets.get(j, 0)) if event.logprobs else None
                offsets[j] = offsets.get(j, 0) + sum(len(e["token"]) for e in event.logprobs)
                for c in choices_of[j]:
                    yield sse(_chunk(service, prep, c, {"content": event.text}, event.text, logprobs=lp))
        j, event = await run.next()
    yield DONE


async def _collect(run: ChoiceRun, first: tuple[int, Any]) -> tuple[dict[int, str], dict[int, Done],
                                                                     dict[int, list]]:
    parts: dict[int, list[str]] = {}
    logprobs: dict[int, list] = {}
    dones: dict[int, Done] = {}
    j, event = first
    while True:
        if isinstance(event, Done):
            dones[j] = event
            if event.error is not None or run.finished:
                break
        else:
            parts.setdefault(j, []).append(event.text)
            logprobs.setdefault(j, []).extend(event.logprobs)
        j, event = await run.next()
    return {j: "".join(parts.get(j, [])) for j in dones}, dones, logprobs


async def respond_choices(service: Any, request: Request, prep: Any, arrived: float, endpoint: str) -> Response:
    """The response to a request with several choices or tools (service._respond's counterpart)."""
    from specrt.serve.disconnect import collect_or_gone
    from specrt.serve.service import failure

    state = request.scope.setdefault("state", {})
    observers = [service._observer(job_view(prep, job), arrived, endpoint) for job in prep.jobs]
    slot = await service._acquire(request)  # the first slot: a 429 when the queue is full
    if slot is None:
        return Response(status_code=499)
    run = ChoiceRun(service, prep.jobs, observers)
    run.start(slot)
    first = await run.next()
    if isinstance(first[1], Done) and first[1].error is not None:
        run.stop()
        raise failure(first[1])
    if prep.stream:
        return EventStream(_events(service, run, first, prep, state), lambda: None if run.finished else run.stop())
    done, collected = await collect_or_gone(request, _collect(run, first), run.stop)
    if not done:
        return Response(status_code=499)
    texts, dones, logprobs = collected
    failed = next((d for d in dones.values() if d.error is not None), None)
    if failed is not None:
        run.stop()
        raise failure(failed)
    state["completion_tokens"] = sum(dones[j].completion_tokens for j in prep.choice_jobs)
    return JSONResponse(final_body(service, prep, texts, dones, logprobs))
