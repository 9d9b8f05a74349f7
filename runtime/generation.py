"""One generation on a Generator: a `PreparedRequest` (runtime/prepared.py) run by the decode loop (loop.py).

`start(gen, ...)` prepares the call unless it is prepared already and returns its `Steps` (runtime/exclusive.py);
`run_steps` builds what one run needs (proposer, k policy, penalties state, the stats) and yields
(new token ids, prompt ids, stats) per step under the Generator's lock. Nothing here checks the call again.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from specrt.runtime.exclusive import Steps
from specrt.runtime.logits_processors import LogitsState
from specrt.runtime.loop import decode
from specrt.runtime.open import open_constraints
from specrt.runtime.prepared import PreparedRequest, prepare_call
from specrt.runtime.stats import GenerationStats


def start(gen, public: str, prompt: Any, max_new_tokens: int | None, request: Any,
          options: dict) -> tuple[Steps, tuple[str, ...]]:
    """(the step generator, the stop strings) of `prompt`, prepared here unless it is a PreparedRequest."""
    gen._check_open()
    if isinstance(prompt, PreparedRequest):
        if max_new_tokens is not None or request is not None or options:
            raise TypeError(f"Generator.{public}() takes a PreparedRequest alone: it holds the whole call")
        prepared = prompt
    else:
        prepared = prepare_call(gen, public, prompt, max_new_tokens, request, options)
    steps = Steps()  # the generation holds only a weak reference to it: dropping the stream ends it
    steps.it = run_steps(gen, prepared, weakref.ref(steps))
    return steps, prepared.stop


def run_steps(gen, prepared: PreparedRequest, steps: "weakref.ref | None" = None):
    """Yield (new token ids, prompt ids, stats) per step of `prepared` on `gen`'s runners."""
    request, prompt_ids = prepared.request, prepared.prompt_ids
    params, max_new_tokens, method = request.sampling, request.max_new_tokens, prepared.method
    constraint = prepared.take_constraint()
    if constraint is None and request.constraint is not None:  # compiled by this run (a copy from the cache)
        constraint = gen.compile_constraint(request.constraint)
    if constraint is not None and gen._constraints is None:  # prepared on another Generator of the bundle
        gen._constraints = open_constraints(gen.manifest, gen.vocab_size, gen.eos_ids)
    logits = prepared.logits
    rng = params.rng()
    logits_state = LogitsState(logits, gen.vocab_size, prompt_ids) if logits is not None else None
    proposer, policy = prepared.proposer, prepared.policy
    with gen._lock.hold(steps):
        if proposer is None and max_new_tokens > 1:  # one token comes from the prefill: nothing to draft
            proposer = gen.make_proposer(method, params, rng, request.ngram_sizes, request.auto_sources)
        if logits_state is not None and logits.changes_logits:  # drafts see the penalties (acceptance)
            for p in (proposer, getattr(proposer, "draft", None)):
                if hasattr(p, "logits_state"):
                    p.logits_state = logits_state
        if proposer is not None and policy is None:
            policy = gen.make_policy(request.num_speculative_tokens, method, params.seed is not None and not params.greedy)
        stats = GenerationStats(method=method, backend=gen.backend, prompt_tokens=int(prompt_ids.size),
                                provider=gen.target.describe().get("provider", gen.backend),
                                context_limited=prepared.context_limited,
                                constraint=constraint.spec.describe() if constraint is not None else "")
        if logits_state is not None:
            stats.token_logprobs = logits_state.logprobs
        started = time.perf_counter()
        explains = policy is not None and hasattr(policy, "off_reason")
        noted_off = False  # whether speculation_note describes speculation as off
        for chunk in decode(gen.target, proposer, policy, prompt_ids, max_new_tokens=max_new_tokens,
                            max_draft_tokens=gen.max_draft_tokens, params=params, rng=rng,
                            eos_ids=request.stop_ids(gen.eos_ids), stats=stats, on_step=prepared.on_step,
                            constraint=constraint,
                            mask_worker=gen._constraints[1] if constraint is not None else None,
                            forced_tokens=request.forced_tokens, logits_state=logits_state):
            stats.elapsed_s = time.perf_counter() - started
            # why speculation is off, built when it turns off (not every step), cleared when it turns back
            # on: a caller that reads the stats mid-stream or stops early sees the current state
            # (a k = 0 step the policy does not call "off", e.g. its first, plain, measuring step: no note)
            if explains and (stats.num_speculative_tokens == 0) != noted_off:
                note = "" if noted_off else policy.off_reason()
                if noted_off or note:
                    noted_off = not noted_off
                    stats.speculation_note = note
            yield chunk, prompt_ids.tolist(), stats
        if noted_off:  # the reason with the final estimates
            stats.speculation_note = policy.off_reason()
