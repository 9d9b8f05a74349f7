"""The speculative decoding loop (the orchestrator): prefill, then draft -> verify -> accept per step.

Invariants, with `tokens[:n]` the committed sequence (prompt + emitted):
* the target cache holds positions [0, n - 1): the last committed token is "pending" and is the first
  token of the next verify pass [tokens[n-1], d_1 .. d_k] at positions n-1 .. n-1+k;
* after j accepted drafts the target cache is truncated to n - 1 + j + 1 positions (O(1) rollback);
* k is clamped so that even a fully accepted step (k drafts + bonus) stays within max_new_tokens and
  the compiled context, and emitted tokens are cut after the first EOS.
Per step the loop does O(k * V) work outside the backends, nothing proportional to the context.
A token tree (`Proposal.parents`, docs/trees.md) is verified in one pass where the target supports trees, accepted
along its longest agreeing root path, and that path's KV rows are moved to consecutive positions (O(depth) rows per
layer); elsewhere (constraints, a sampled draft model, a runner without trees) its first chain is verified.
The step's pieces (verify, the acceptance rule chosen by `Proposal.kind`, the commit) are runtime/step.py's, which
the batching scheduler runs too; this loop adds what a single sequence has: constraints, penalties / logprobs,
forced tokens, the adaptive k policy and the timings.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

import numpy as np

from specrt.runtime.backends.base import Runner
from specrt.runtime.constrained import MaskWorker, masked_logits, shape_proposal
from specrt.runtime.constraint import Constraint
from specrt.runtime.logits_processors import LogitsState
from specrt.runtime.policy import KPolicy
from specrt.runtime.proposers.base import SAMPLED, Proposer
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.stats import GenerationStats
from specrt.runtime.step import (Decoding, accept, commit, keep_path, no_drafts, pick_token, record, tree_or_chain,
                                 verify_rows)

__all__ = ["PREFILL_CHUNK", "decode", "pick_token", "tree_or_chain"]  # pick_token, tree_or_chain: runtime/step.py

PREFILL_CHUNK = 256


def decode(target: Runner, proposer: Proposer | None, policy: KPolicy | None, prompt_ids: np.ndarray, *,
           max_new_tokens: int, max_draft_tokens: int, params: SamplingParams, rng: np.random.Generator,
           eos_ids: frozenset[int], stats: GenerationStats,
           on_step: Callable[[int, int, int], None] | None = None, constraint: Constraint | None = None,
           mask_worker: MaskWorker | None = None, forced_tokens: bool = True,
           logits_state: LogitsState | None = None) -> Iterator[list[int]]:
    """Yield the emitted tokens of each step (1 + accepted drafts, cut at EOS / limits).

    `on_step(k, drafted, accepted)` (optional) sees every step that had a proposer, k as clamped by the loop.
    `constraint` (optional): every verified position's distribution is masked by it, drafts it refuses end
    the proposal, and with `forced_tokens` (and a proposer) the tokens it forces are verified in the same
    pass; masks are computed by `mask_worker` while the target runs (runtime/constrained.py).
    `logits_state` (optional): penalties / logit_bias applied to every target row with the counts as of its
    position, and logprobs of the emitted tokens (runtime/logits_processors.py).
    """
    hook = logits_state.apply if logits_state is not None else (lambda rows, fed: rows)
    # greedy without a constraint reads only each row's argmax: a screened LM head may skip the full rows
    target.set_argmax_only(params.greedy and constraint is None and logits_state is None)
    try:
        capacity = target.capacity
        seq = Decoding(target, np.empty(capacity, dtype=np.int64), prompt_ids.size, proposer, stats)
        tokens = seq.tokens  # committed sequence tokens[:seq.n], preallocated
        n = seq.n
        tokens[:n] = prompt_ids
        started = time.perf_counter()
        target.reset()
        if constraint is not None:
            pending = mask_worker.submit(constraint.masks, [])
            last_logits = masked_logits(hook(target.prefill(tokens[:n], PREFILL_CHUNK)[None, :], tokens[:0]),
                                        pending.result())[0]
            first = pick_token(last_logits, params, rng)
            constraint.consume([first])
        else:
            first = pick_token(hook(target.prefill(tokens[:n], PREFILL_CHUNK)[None, :], tokens[:0])[0], params, rng)
        stats.target_calls += (n + PREFILL_CHUNK - 1) // PREFILL_CHUNK
        tokens[n] = first
        seq.n += 1
        if logits_state is not None:
            logits_state.commit([first])
        if proposer is not None and first not in eos_ids:
            proposer.start(tokens, seq.n, target.hidden_states)
        stats.prefill_seconds = time.perf_counter() - started
        stats.new_tokens = 1
        yield [first]
        if first in eos_ids:
            stats.finish_reason = "stop"
            return
        while True:
            remaining = max_new_tokens - stats.new_tokens
            room = capacity - seq.n
            if remaining <= 0 or room <= 0:
                stats.finish_reason = "length"
                return
            k = policy.next_k() if proposer is not None else 0
            k = max(0, min(k, max_draft_tokens, remaining - 1, room - 1))
            # 1. propose
            t0 = time.perf_counter()
            if k > 0:
                proposal = proposer.propose(tokens, seq.n, k)
                stats.draft_calls += proposal.calls
                # a chain where a constraint, a sampled draft or penalties (counts per row, not per tree path) apply
                chain_only = constraint is not None or proposal.kind == SAMPLED or logits_state is not None
                proposal = tree_or_chain(proposal, k, target, chain_only)
            else:
                proposal = no_drafts(tokens)
            own = proposal.token_ids.size  # the proposer's tokens (for the policy and the proposer's observe)
            if constraint is not None:
                limit = min(max_draft_tokens, remaining - 1, room - 1) if forced_tokens and proposer is not None else 0
                shaped = shape_proposal(constraint, proposal.token_ids, proposal.probs, limit)
                proposal = dataclasses.replace(proposal, token_ids=shaped.drafts, probs=shaped.probs)
                verify_ids, own = shaped.verify_ids, shaped.kept
                pending = mask_worker.submit(constraint.masks, verify_ids.tolist())
            else:
                verify_ids = proposal.token_ids
            # 2. verify
            t1 = time.perf_counter()
            kk, past = verify_ids.size, seq.n - 1
            raw, row_argmax = verify_rows(seq, verify_ids, proposal.parents)  # [kk + 1, V], [kk + 1] or None
            logits = hook(raw, verify_ids)  # penalties / bias with the counts as of each row (a chain: see above)
            if constraint is not None:
                logits = masked_logits(logits, pending.result())
                if proposal.token_ids.size > kk:  # a refused sampled draft, rejected for sure: a row never read
                    logits = np.concatenate([logits, logits[-1:]])
            # 3. accept (a tree: the longest accepted root path, its KV rows moved into place)
            hidden = target.hidden_states
            # the table's refresh found the raw rows' argmax: the greedy rule's, while nothing changed the rows
            plain_rows = constraint is None and logits_state is None
            verdict = accept(proposal, logits, params, rng, row_argmax if plain_rows else None)
            if proposal.parents is not None:
                hidden = keep_path(target, past, verdict.path, hidden)
                stats.tree_passes += 1
            j, nxt = verdict.count, verdict.token
            t2 = time.perf_counter()
            # 4. commit
            if constraint is not None:
                constraint.rollback(kk - j)
                stats.forced_tokens += shaped.forced
                stats.forced_accepted += min(max(j - own, 0), shaped.forced)
                if nxt not in eos_ids or constraint.valid_prefix([nxt]):
                    constraint.consume([nxt])
            record(stats, k, proposal, verdict)
            # the proposer's own tokens were cut or followed by forced ones: it saw no further than its own
            emitted = commit(seq, verdict.emitted(proposal), j, eos_ids, hidden,
                             None if own == proposal.token_ids.size else own)
            if logits_state is not None:
                logits_state.commit(emitted)
            stats.draft_seconds += t1 - t0
            stats.verify_seconds += t2 - t1
            if proposer is not None:
                policy.update(k, own, min(j, own), t1 - t0 - proposal.catch_up_s, t2 - t1)
                if on_step is not None:
                    on_step(k, kk, j)
                stats.num_speculative_tokens = policy.current_k
            yield emitted
            if emitted[-1] in eos_ids:
                stats.finish_reason = "stop"
                return
    finally:
        target.set_argmax_only(False)
