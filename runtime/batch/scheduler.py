"""`Scheduler`: continuous batching with per-request speculation, on one Generator's weights.

A step decides, per decoding request, k (0 allowed) and its proposal, and the family of passes that verifies them
(`plan` -> `StepPlan`), runs those passes (`run`), commits each request's accepted tokens (`update`) and retires the
finished ones. Requests join and leave at step boundaries:
1. admit: waiting requests take free regions (FCFS); a prompt another request shares, or a cached prefix, is copied
   (shared_prompt.py, prefix_cache.py: hooks at `_admit`, `_prefill_chunks`, `_prefill_done`, `_finish`);
2. plan (plan.py): the free proposals and k bounds, the family (`FamilyChooser`, family.py: fused or packed, by
   calibrated predicted goodput with hysteresis), the k plan (goodput.py); prompt chunks spend `prefill_chunk`
   tokens per step on the requests in prefill, oldest first;
3. run and update (passes.py), pass by pass, each pass's tokens committed before the next runs: fused family, the
   prompt chunks (`PrefillPass`), an own pass per request with drafts (`OwnPass`), then ONE one-token pass over
   every decoding request (`BatchedTokenPass`) or own passes for all; packed family, ONE pass of every request's
   rows and the prompt chunks (`PackedRowsPass`). Every verify goes through runtime/step.py's accept and commit;
4. retire: finished or cancelled requests free their regions at once (a first token that ends a request: at once).
Decoding requests hold regions [0, d) in `running` order, those in prefill the ones after them; greedy output equals
the request's alone (tests/runtime/test_batching.py). `auto` and `recycle` offer scored trees (trees.py), verified as
trees in their own passes of the fused family where the target has trees, else as their best chains.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Iterable

import numpy as np

from specrt.core.errors import BackendUnavailable
from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
from specrt.runtime.backends.ort.threads import shared_pool
from specrt.runtime.batch.family import FUSED, PACKED, FamilyChooser
from specrt.runtime.batch.goodput import CostTable
from specrt.runtime.batch.passes import Passes, guarded
from specrt.runtime.batch.plan import (BatchedTokenPass, Chunk, OwnPass, PackedRowsPass, PrefillPass, StepPlan,
                                       decode, prepare, request_ks)
from specrt.runtime.batch.pool import RegionPool
from specrt.runtime.prefix_budget import DEFAULT_PREFIX_CACHE_MB
from specrt.runtime.batch.prefix_cache import PrefixCaching
from specrt.runtime.batch.protocol import KVPool
from specrt.runtime.batch.sequence import BatchSequence
from specrt.runtime.batch import trees
from specrt.runtime.batch.shared_prompt import PromptSharing
from specrt.runtime.proposers.build import Drafters, build_proposer
from specrt.runtime.proposers.draft_model import DraftModelProposer
from specrt.runtime.step import pick_token

DEFAULT_PREFILL_CHUNK = 256  # prompt tokens prefilled per step (all requests in prefill together)
BATCH_METHODS = ("draft", "hybrid", "ngram", "none", "auto", "recycle")


class Scheduler:
    def __init__(self, gen, max_batch: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 packed: bool | None = None, prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB) -> None:
        """`packed`: use the packed pass (a second ONNX Runtime session over the same weights file, so the weights
        are pre-packed twice in memory; runtime/batch/packed.py). None: on unless SPECRT_PACKED=0.
        `prefix_cache_mb`: the prefix cache's budget (prefix_cache.py); 0 turns it off."""
        from specrt.runtime.backends import BATCH_BACKENDS
        from specrt.runtime.batch.costs import cost_table
        from specrt.runtime.batch.slots import batch_backend, slot_pool

        fused = isinstance(gen.target, OrtFusedRunner)
        if not fused and batch_backend(gen) is None:
            raise BackendUnavailable("continuous batching runs on the fused ONNX Runtime graph (backend 'ort', CPU) "
                                     f"or a batch runner ({', '.join(BATCH_BACKENDS)}); this generator's target "
                                     f"runs on {gen.backend!r}")
        self.gen, self.max_batch, self.prefill_chunk = gen, max_batch, prefill_chunk
        # the fused graph's regions, or the batched portable graph's slots: ort-portable, torch, trt (slots.py)
        self.targets: KVPool = RegionPool(gen.target, max_batch) if fused else slot_pool(gen, max_batch)
        self.drafts = RegionPool(gen.draft, max_batch) if fused and isinstance(gen.draft, OrtFusedRunner) else None
        self.sharing = PromptSharing(self.targets)  # one prefill per prompt (shared_prompt.py)
        self.prefix = PrefixCaching(self.targets, prefix_cache_mb, prefill_chunk)  # across time (prefix_cache.py)
        self.waiting: collections.deque[BatchSequence] = collections.deque()
        self.prefilling: list[BatchSequence] = []
        self.running: list[BatchSequence] = []
        # A target whose one-token calls run as min_rows rows (int4 at accuracy level 4) computes a one-token row
        # differently from the batched pass: its requests run their own passes (identical to alone; docs/batching.md)
        self.min_rows = self.targets.runners[0].min_rows
        self.batched_decode = self.min_rows <= 1
        # token trees (trees.py): verified in own passes on the fused regions where the graph has the tree input
        self.trees = fused and getattr(self.targets.runners[0], "supports_tree", False)
        self.auto_state = trees.batch_state(gen)  # acceptance estimates of the batch's auto requests
        if packed is None:
            packed = os.environ.get("SPECRT_PACKED", "1") != "0"
        self.packed = packed and max_batch > 1
        if self.packed:  # built here, on the caller's thread (not lazily on the engine's: imports are not thread-safe)
            self.targets.packed()
        # Both sessions on the process's one thread pool (backends/ort/threads.py), or a batch runner (both families
        # are its passes): switching between families costs nothing, so the family is chosen step by step
        switch_free = shared_pool() is not None or not fused
        costs = cost_table(gen, self.targets, max_batch, packed=self.packed)  # measured once, then cached
        self.chooser = FamilyChooser(costs, self.packed, self.batched_decode, switch_free)
        self.passes = Passes(gen, self.targets, self._prefill_done)
        self.steps, self.step_tokens, self.step_seconds = 0, 0, 0.0  # decode steps, their tokens and seconds: goodput

    @property
    def costs(self) -> CostTable:
        return self.chooser.costs

    @costs.setter
    def costs(self, table: CostTable) -> None:
        self.chooser.costs = table

    @property
    def methods(self) -> list[str]:
        return [m for m in self.gen.methods
                if m in BATCH_METHODS and (m in ("ngram", "none", *trees.TREE_METHODS) or self.drafts)]

    # ----------------------------------------------------------------------------------- admit
    def add(self, seq: BatchSequence) -> None:
        """Queue a request the engine's intake checked (runtime/batch/intake.py): nothing is checked again."""
        self.waiting.append(seq)

    @property
    def active(self) -> int:
        return len(self.running) + len(self.prefilling)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def _admit(self) -> None:
        while self.waiting and self.targets.used < self.max_batch:
            seq = self.waiting.popleft()
            if seq.cancel.is_set():
                self._finish(seq, "cancelled", release=False)
                continue
            seq.tokens = np.empty(self.gen.max_seq_len, np.int64)
            seq.tokens[:seq.prompt_ids.size] = seq.prompt_ids
            seq.n = seq.prompt_ids.size
            seq.target = self.targets.acquire()
            seq.rng = seq.request.sampling.rng()
            seq.proposer = guarded(seq, self._proposer, seq)  # (one that raises fails this request: failures.py)
            params = seq.request.sampling
            if seq.proposer is not None and params.seed is not None and not params.greedy:
                # which random numbers a step draws depends on its k: a seeded request keeps the k schedule it has
                # alone (the Generator's count-only policy), whatever the plan would choose for it
                seq.policy = self.gen.make_policy(seq.request.num_speculative_tokens, seq.method, seeded=True)
            self.sharing.on_admit(seq, self.running + self.prefilling)  # hook: admitted (its region is empty)
            self.prefix.on_admit(seq)
            self.prefilling.append(seq)

    def _complete_shared(self) -> None:
        """Sequences whose prompt rows were copied from a donor (shared_prompt.py) complete their prefill once they
        are the oldest in prefill (their region is then the first after the running ones)."""
        while self.prefilling and self.prefilling[0].shared_last is not None:
            seq = self.prefilling[0]
            last, seq.shared_last = seq.shared_last, None
            self._prefill_done(seq, last)

    def _proposer(self, seq: BatchSequence):
        """The request's proposer (runtime/proposers/build.py); a draft model's on a draft region of its own, lazy:
        prefilled on its first drafting step, never if the plans never draft it."""
        if seq.method == "none" or seq.max_k == 0:
            return None
        if seq.method in trees.TREE_METHODS:
            return trees.tree_proposer(self.gen, seq.method, seq.request.sampling, seq.request.ngram_sizes,
                                       self.auto_state, seq.request.auto_sources)

        def draft():
            seq.draft = self.drafts.acquire()
            return DraftModelProposer(seq.draft, seq.request.sampling, seq.rng, self.gen.vocab_size, lazy=True)

        return build_proposer(seq.method, self.gen.eos_ids, seq.request.ngram_sizes,
                              Drafters(draft=draft if self.drafts is not None else None))

    # ------------------------------------------------------------------------------------ step
    def step(self) -> None:
        t0, tokens0 = time.perf_counter(), self.step_tokens
        self._admit()
        self._complete_shared()
        plan = self._round(self.plan())
        if plan.then_decode:  # fused, prompt chunks first: the requests they completed join the decode
            plan = self._round(self.plan(decode_only=True))
        if plan.goodput > 0:  # realized over predicted goodput of the family used (prefill work included)
            realized = (self.step_tokens - tokens0) / max(time.perf_counter() - t0, 1e-9)
            self.chooser.calibrate(realized, plan.goodput, plan.drafted)
        self._retire()

    def _round(self, plan: StepPlan) -> StepPlan:
        """Run and commit `plan`'s passes in order; a decode counts as a step (goodput: `step_tokens` over
        `step_seconds`, planning included)."""
        t0 = time.perf_counter()
        emitted = sum(self.update(p, self.run(p)) for p in plan.passes)
        if plan.decoding:
            self.steps += 1
            self.step_tokens += emitted
            self.step_seconds += time.perf_counter() - t0 + plan.planning_s
        return plan

    def plan(self, decode_only: bool = False) -> StepPlan:
        """This step's plan: the family (asked of the chooser unless `decode_only`: the decode after a fused step's
        prompt chunks), then per decoding request k and its proposal (made here), and the passes."""
        t0 = time.perf_counter()
        prepared = prepare(self.running, self.costs, self.gen.max_seq_len, self.trees) if self.running else None
        family, planned = FUSED, None
        if prepared is not None and not decode_only and not prepared.seeded_trees:
            family, planned = self.chooser.choose(prepared.acceptance, prepared.max_ks, prepared.draft_costs,
                                                  bool(self.prefilling), prepared.gains)
        if family == FUSED and self.prefilling and not decode_only:
            return StepPlan(FUSED, [PrefillPass(c) for c in self._prefill_chunks()], then_decode=True)
        if prepared is None:
            return StepPlan(FUSED, [])
        kplan = self.chooser.plan(family, prepared.acceptance, prepared.max_ks, prepared.draft_costs, planned,
                                  prepared.gains)
        ks = request_ks(prepared, kplan.ks, family == PACKED)
        decodes = [decode(s, k, f, o, family == PACKED or not self.trees)
                   for s, k, f, o in zip(prepared.seqs, ks, prepared.free, prepared.offers)]
        if family == PACKED:
            passes = [PackedRowsPass(decodes, self._prefill_chunks())]
        else:
            passes = [OwnPass(d) for d in decodes if d.k > 0 or not kplan.batched]
            if kplan.batched:
                passes.append(BatchedTokenPass(decodes))
        return StepPlan(family, passes, kplan.goodput, any(ks), decoding=True,
                        planning_s=time.perf_counter() - t0)

    def _prefill_chunks(self) -> list[Chunk]:
        """This step's prompt chunks: the prompt-token budget spent on the requests in prefill, oldest first."""
        chunks, budget = [], self.prefill_chunk
        for seq in self.prefilling:
            if budget <= 0 or self.sharing.blocked(seq):
                break
            ids = seq.prompt_ids[seq.prefilled:seq.prefilled + budget]
            self.prefix.on_chunk(seq, ids.size)
            budget -= ids.size
            chunks.append(Chunk(seq, ids))
        return chunks

    # ------------------------------------------------------------------------------- run, update
    def run(self, p):
        """Execute one pass of a plan -> its outputs (passes.py)."""
        return self.passes.run(p)

    def update(self, p, out) -> int:
        """Commit one pass's outputs into its requests (passes.py); returns the decode tokens emitted."""
        return self.passes.update(p, out)

    def _prefill_done(self, seq: BatchSequence, last: np.ndarray) -> None:
        """The prompt is in the cache: pick the first token from its last row's logits; decode from the next step."""
        self.sharing.on_prefilled(seq, last)  # hook: prefill done
        self.prefix.on_prefilled(seq)
        first_token = pick_token(last, seq.request.sampling, seq.rng)
        seq.tokens[seq.n] = first_token
        seq.n += 1
        if seq.proposer is not None and first_token not in seq.stop_ids:
            guarded(seq, seq.proposer.start, seq.tokens, seq.n, None)
        seq.stats.new_tokens = 1
        self.prefilling.remove(seq)  # the oldest in prefill: its region is d, the first after the running ones
        self.passes.emit(seq, [first_token])
        if seq.finished or seq.cancel.is_set():  # its first token ended it (EOS, max_new_tokens=1, a stop string
            # its caller saw, a client gone): no decode step, as alone
            self._finish(seq, seq.finished or "cancelled")
            return
        self.running.append(seq)

    # ---------------------------------------------------------------------------------- retire
    def _retire(self) -> None:
        done = []
        for s in list(self.running):
            if s.cancel.is_set() and not s.finished:
                s.finished = s.stats.finish_reason = "cancelled"
            if s.finished:
                self.running.remove(s)
                done.append((s, s.finished))
        for s in list(self.prefilling):
            if s.cancel.is_set() or s.error is not None:
                self.prefilling.remove(s)
                done.append((s, "error" if s.error is not None else "cancelled"))
        # highest region first: freeing a region moves every region above it down one (a fused pool copies their
        # valid KV rows), so requests that end in the same step are freed without moving one another
        done.sort(key=lambda d: self.targets.region_of(d[0].target), reverse=True)
        for s, reason in done:
            self._finish(s, reason)
        for s in list(self.waiting):
            if s.cancel.is_set():
                self.waiting.remove(s)
                self._finish(s, "cancelled", release=False)

    def _finish(self, s: BatchSequence, reason: str, release: bool = True) -> None:
        self.sharing.on_finish(s)  # hook: finished (or cancelled, or never admitted)
        self.prefix.on_finish(s, reason)
        if release:
            self.targets.release(s.target)
            if s.draft is not None:
                self.drafts.release(s.draft)
        s.target = s.draft = s.proposer = None
        s.finished = s.stats.finish_reason = reason
        s.emit([] if s.error is None else s.error, s)  # the end: an empty chunk with the final stats, or its error

    def abort_all(self, exc: BaseException, queued: Iterable[BatchSequence] = ()) -> None:
        """End every request held (running, in prefill, waiting, then `queued`: submitted, not added yet) with
        `exc`, and free every region: after a failed step, or when the engine closes."""
        for s in [*self.running, *self.prefilling, *self.waiting, *queued]:
            s.emit(exc, s)
        self.running, self.prefilling = [], []
        self.waiting.clear()
        self.targets.release_all()
        if self.drafts is not None:
            self.drafts.release_all()
