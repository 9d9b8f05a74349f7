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
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import numpy as np

from specrt.runtime.acceptance import greedy_accept, greedy_accept_tree, rejection_sample, rejection_sample_tree
from specrt.runtime.backends.base import Runner
from specrt.runtime.constrained import MaskWorker, masked_logits, shape_proposal
from specrt.runtime.constraint import Constraint
from specrt.runtime.logits_processors import LogitsState
from specrt.runtime.policy import KPolicy
from specrt.runtime.proposers.base import Proposer
from specrt.runtime.sampling import SamplingParams, sample, warp
from specrt.runtime.stats import GenerationStats
from specrt.runtime.tree import first_chain, is_chain

PREFILL_CHUNK = 256


def pick_token(logits_row: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    if params.greedy:
        return int(logits_row.argmax())
    return sample(warp(logits_row[None, :], params)[0], rng)


def tree_or_chain(drafts: np.ndarray, probs: np.ndarray | None, parents: np.ndarray | None, k: int,
                  target: Runner, chain_only: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(drafts, probs, parents) as verified: at most k nodes (and the runner's tree rows) kept in topological order
    (a prefix of a tree is a tree); parents None for a chain. The first chain of the tree (the path of first
    children) where the runner has no tree input, the target has no past yet, or `chain_only` (a constraint, a
    sampled draft model: docs/trees.md)."""
    if parents is None:
        return drafts, probs, None
    trees = getattr(target, "supports_tree", False)  # runners that are not `Runner`s (a batch slot) verify chains
    keep = min(k, drafts.size)
    if trees and not chain_only:
        keep = min(keep, max(target.tree_max_rows - 1, 1))
    drafts, parents = drafts[:keep], parents[:keep]
    probs = probs[:keep] if probs is not None else None
    if is_chain(parents):
        return drafts, probs, None
    if chain_only or not trees or target.length == 0:
        idx = first_chain(parents)
        return drafts[idx], (probs[idx] if probs is not None else None), None
    return drafts, probs, parents


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
        tokens = np.empty(capacity, dtype=np.int64)  # committed sequence, preallocated
        n = prompt_ids.size
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
        n += 1
        if logits_state is not None:
            logits_state.commit([first])
        if proposer is not None and first not in eos_ids:
            proposer.start(tokens, n, target.hidden_states)
        stats.prefill_seconds = time.perf_counter() - started
        stats.new_tokens = 1
        yield [first]
        if first in eos_ids:
            stats.finish_reason = "stop"
            return
        while True:
            remaining = max_new_tokens - stats.new_tokens
            room = capacity - n
            if remaining <= 0 or room <= 0:
                stats.finish_reason = "length"
                return
            k = policy.next_k() if proposer is not None else 0
            k = max(0, min(k, max_draft_tokens, remaining - 1, room - 1))
            t0 = time.perf_counter()
            source, catch_up_s = "", 0.0
            parents = None  # [k'] a token tree's parents, None for a chain
            if k > 0:
                proposal = proposer.propose(tokens, n, k)
                drafts, draft_probs = proposal.token_ids, proposal.probs  # probs: None for a point mass
                # a chain where a constraint, a sampled draft or penalties (counts per row, not per tree path) apply
                chain_only = constraint is not None or draft_probs is not None or logits_state is not None
                drafts, draft_probs, parents = tree_or_chain(drafts, draft_probs, proposal.parents, k, target,
                                                             chain_only)
                stats.draft_calls += proposal.calls
                source, catch_up_s = proposal.source, proposal.catch_up_s
            else:
                drafts, draft_probs = tokens[:0], None
            own = drafts.size  # the proposer's tokens (for the policy and the proposer's observe)
            if constraint is not None:
                limit = min(max_draft_tokens, remaining - 1, room - 1) if forced_tokens and proposer is not None else 0
                shaped = shape_proposal(constraint, drafts, draft_probs, limit)
                drafts, draft_probs, verify_ids, own = shaped.drafts, shaped.probs, shaped.verify_ids, shaped.kept
                pending = mask_worker.submit(constraint.masks, verify_ids.tolist())
            else:
                verify_ids = drafts
            t1 = time.perf_counter()
            kk = verify_ids.size
            tokens[n:n + kk] = verify_ids  # scratch: overwritten by what is actually emitted below
            past = n - 1
            fed = tokens[n - 1:n + kk]
            raw = target.forward(fed) if parents is None else target.forward(fed, parents)  # [kk + 1, V]
            stats.target_calls += 1
            observe_verify = getattr(proposer, "observe_verify", None)
            if observe_verify is not None:  # the fed rows and the target's raw rows for them (Token Recycling)
                observe_verify(tokens[n - 1:n + kk].copy(), raw, parents)
            logits = hook(raw, verify_ids)  # penalties / bias with the counts as of each row (a chain: see above)
            if constraint is not None:
                logits = masked_logits(logits, pending.result())
                if drafts.size > kk:  # a refused sampled draft, rejected for sure: a row the rule never reads
                    logits = np.concatenate([logits, logits[-1:]])
            hidden = target.hidden_states
            if parents is not None:  # a tree: the longest accepted root path, its KV rows moved into place
                if params.greedy:
                    path, nxt = greedy_accept_tree(drafts, parents, logits)
                else:
                    path, nxt = rejection_sample_tree(drafts, parents, warp(logits, params), rng)
                j, accepted = len(path), drafts[path].tolist()
                rows = [i + 1 for i in path]
                target.keep_path(past, rows)
                hidden = hidden[[0, *rows]] if hidden is not None else None
            elif params.greedy:
                j, nxt = greedy_accept(drafts, logits)
                accepted = drafts[:j].tolist()
            else:
                q = warp(logits, params)
                if draft_probs is not None and draft_probs.shape[1] > q.shape[1]:
                    q = np.pad(q, ((0, 0), (0, draft_probs.shape[1] - q.shape[1])))
                j, nxt = rejection_sample(drafts, draft_probs, q, rng)
                accepted = drafts[:j].tolist()
            t2 = time.perf_counter()
            emitted = accepted + [nxt]
            if constraint is not None:
                constraint.rollback(kk - j)
                stats.forced_tokens += shaped.forced
                stats.forced_accepted += min(max(j - own, 0), shaped.forced)
                if nxt not in eos_ids or constraint.valid_prefix([nxt]):
                    constraint.consume([nxt])
            for i, t in enumerate(emitted):
                if t in eos_ids:
                    emitted = emitted[: i + 1]
                    break
            tokens[n:n + len(emitted)] = emitted
            n += len(emitted)
            if logits_state is not None:
                logits_state.commit(emitted)
            target.truncate(n - 1)
            stats.record_step(k, drafts.size, j, source)
            stats.draft_seconds += t1 - t0
            stats.verify_seconds += t2 - t1
            if proposer is not None:
                # the proposer's own tokens were cut or followed by forced ones: it saw no further than its own
                proposer.observe(n if own == drafts.size else min(n, n - len(emitted) + own + 1), j, hidden)
                policy.update(k, own, min(j, own), t1 - t0 - catch_up_s, t2 - t1)
                if on_step is not None:
                    on_step(k, kk, j)
                stats.num_speculative_tokens = policy.current_k
            stats.new_tokens += len(emitted)
            yield emitted
            if emitted[-1] in eos_ids:
                stats.finish_reason = "stop"
                return
    finally:
        target.set_argmax_only(False)
