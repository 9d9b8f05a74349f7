"""`Scheduler`: continuous batching with per-request speculation, on one Generator's weights.

Requests join and leave at step boundaries. A step (`step()`):
1. admits waiting requests while slots are free (FCFS) and spends a budget of `prefill_chunk` prompt tokens on
   the requests in prefill, oldest first (a long prompt is split into chunks interleaved with the running decodes
   instead of stalling them; several short prompts are prefilled in one step);
2. plans the step (goodput.py): k per decoding request (0 allowed) from its acceptance estimate and the measured
   cost table, and whether the batched one-token pass runs;
3. each request with drafts runs one pass over its pending token and its drafts in its own region, then the
   acceptance rule of the single-sequence loop (`greedy_accept` / `rejection_sample`): exactly a step of the
   loop alone; when the plan is batched, ONE batched pass over every decoding request's pending token
   (`RegionPool.decode_batch`) then gives each request one more token (plan not batched: requests without
   drafts run a one-token pass of their own, so one request alone is the single-sequence loop); when the plan
   is packed, ONE pass of the packed graph (runtime/batch/packed.py) runs every request's pending token and
   drafts and the prompt chunks of the requests in prefill, each request's rows exactly its own call alone (a
   target that pads calls to `min_rows` gets the padding in attention only), then each request's acceptance
   rule; which family of passes runs (packed, or fused: batched / separate) is `_packed_step_due`'s choice;
4. emits each request's new tokens and retires finished or cancelled requests (their slots are free at once).
A request whose prefill token already ends it (EOS, max_new_tokens=1) leaves at once, before any decode.
For n-gram requests the proposal is free: it is made before planning (k is capped by what matched), and when the
request does not speculate its first draft is still compared with the token the batched pass picks, so its
acceptance estimate stays current at no cost.

Region order: decoding requests hold target regions [0, d) in `running` order; the requests in prefill hold the
regions after them, in `prefilling` order (prefill completes oldest first, so a finished prefill's region is
always d). A request's greedy output equals its output alone (tests/runtime/test_batching.py).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time

import numpy as np

from specrt.core.errors import BackendUnavailable, InvalidArgument
from specrt.runtime.acceptance import greedy_accept, rejection_sample
from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
from specrt.runtime.backends.ort.threads import shared_pool
from specrt.runtime.batch.goodput import CostTable, StepPlan, plan_packed, plan_step
from specrt.runtime.batch.pool import RegionPool
from specrt.runtime.batch.sequence import DRAFT_KIND, Sequence
from specrt.runtime.batch.shared_prompt import PromptSharing
from specrt.runtime.loop import pick_token
from specrt.runtime.proposers.draft_model import DraftModelProposer
from specrt.runtime.proposers.ngram import NgramProposer
from specrt.runtime.sampling import warp

DEFAULT_PREFILL_CHUNK = 256  # prompt tokens prefilled per step (all requests in prefill together)
SWITCH_MARGIN = 1.15  # predicted goodput the packed family must offer before the scheduler moves to it
LEAVE_MARGIN = 1.05  # ... and the fused family, to move back
RATIO_DECAY = 0.8  # smoothing of the predicted packed / fused goodput ratio over steps
MIN_FAMILY_STEPS = 8  # steps in a family before the scheduler may switch again
CALIBRATION_DECAY = 0.9  # smoothing of each family's realized / predicted goodput
CALIBRATION_RELAX = 0.02  # per plain step: how far a family's drafting calibration moves back to its plain one
BATCH_METHODS = ("draft", "hybrid", "ngram", "none", "auto")  # auto: n-gram chains here (#51)
PROBE_AFTER = 8  # steps without drafting after which a draft-model request drafts one token (`_probe`)


class Scheduler:
    def __init__(self, gen, max_batch: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 packed: bool | None = None) -> None:
        """`packed`: use the packed pass (a second ONNX Runtime session over the same weights file, so the weights
        are pre-packed twice in memory; runtime/batch/packed.py). None: on unless SPECRT_PACKED=0."""
        from specrt.runtime.backends import BATCH_BACKENDS
        from specrt.runtime.batch.slots import batch_backend

        fused = isinstance(gen.target, OrtFusedRunner)
        if not fused and batch_backend(gen) is None:
            raise BackendUnavailable("continuous batching runs on the fused ONNX Runtime graph (backend 'ort', CPU) "
                                     f"or a batch runner ({', '.join(BATCH_BACKENDS)}); this generator's target "
                                     f"runs on {gen.backend!r}")
        self.gen, self.max_batch, self.prefill_chunk = gen, max_batch, prefill_chunk
        if fused:
            self.targets = RegionPool(gen.target, max_batch)
        else:  # the batched portable graph: ort-portable, torch, trt (runtime/batch/slots.py)
            from specrt.runtime.batch.slots import slot_pool

            self.targets = slot_pool(gen, max_batch)
        self.drafts = RegionPool(gen.draft, max_batch) if fused and isinstance(gen.draft, OrtFusedRunner) else None
        self.sharing = PromptSharing(self.targets)  # one prefill per prompt (shared_prompt.py)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        # A target whose one-token calls run as min_rows rows (MatMulNBits accuracy level 4, batch-invariant
        # default) computes a one-token row differently from the batched pass (one token per sequence: ONNX
        # Runtime's one-token attention path differs from its several-token one by ~1e-6, which int8 activations
        # turn into other tokens on a few % of steps). Its requests run their own passes (identical to alone).
        self.min_rows = self.targets.runners[0].min_rows
        self.batched_decode = self.min_rows <= 1
        if packed is None:
            packed = os.environ.get("SPECRT_PACKED", "1") != "0"
        self.packed = packed and max_batch > 1
        # Both sessions on the process's one thread pool (backends/ort/threads.py): switching between them costs
        # nothing, so the family is chosen step by step; else the switches are rationed (`_packed_step_due`).
        self.switch_free = shared_pool() is not None or not fused  # a batch runner: both families are its passes
        self.family = "fused"  # the family of passes of the last step: "fused" (batched / separate) or "packed"
        self.family_steps = 0  # steps since the family last changed
        self.packed_ratio = 1.0  # smoothed predicted goodput of the packed family over the fused one
        self.calibration = {"fused": 1.0, "packed": 1.0}  # per family: realized / predicted goodput (smoothed)
        # ... of the steps that drafted, apart (`_spec_or_plain`): the cost table and the acceptance estimates err
        # differently when a step drafts, and a drafting step must beat the plain one as realized, not as predicted
        self.spec_calibration = {"fused": 1.0, "packed": 1.0}
        self._drafted = False  # whether the current step's plan drafted
        self._planned = 0.0  # predicted goodput of the current step's plan
        self._plans = None  # (prepared, packed plan, fused plan) when `_packed_step_due` planned both this step
        if self.packed:  # built here, on the caller's thread (not lazily on the engine's: imports are not thread-safe)
            self.targets.packed()
        self.costs = self._measure_costs()
        self.steps = 0
        self.step_tokens = 0  # tokens emitted by decode steps, and their seconds: goodput
        self.step_seconds = 0.0

    @property
    def methods(self) -> list[str]:
        return [m for m in self.gen.methods if m in BATCH_METHODS and (m in ("ngram", "none", "auto") or self.drafts)]

    # ---------------------------------------------------------------------------------- costs
    def _measure_costs(self) -> CostTable:
        """The cost table of this graph and device (runtime/batch/costs.py: measured once, then cached)."""
        from specrt.runtime.batch.costs import cost_table

        return cost_table(self.gen, self.targets, self.max_batch, packed=self.packed)

    # ----------------------------------------------------------------------------------- admit
    def add(self, seq: Sequence) -> None:
        if seq.method not in self.methods:
            raise InvalidArgument(f"method {seq.method!r} is not available with batching; choose one of "
                                  f"{', '.join(self.methods)}")
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
            gen = self.gen
            seq.tokens = np.empty(gen.max_seq_len, np.int64)
            seq.tokens[:seq.prompt_ids.size] = seq.prompt_ids
            seq.n = seq.prompt_ids.size
            seq.target = self.targets.acquire()
            seq.rng = seq.request.sampling.rng()
            seq.proposer = self._proposer(seq)
            params = seq.request.sampling
            if seq.proposer is not None and params.seed is not None and not params.greedy:
                # which random numbers a step draws depends on its k: a seeded request keeps the k schedule it has
                # alone (the Generator's count-only policy), whatever the plan would choose for it
                seq.policy = gen.make_policy(seq.request.num_speculative_tokens,
                                             "ngram" if seq.method == "auto" else seq.method, seeded=True)  # #51
            self.sharing.on_admit(seq, self.running + self.prefilling)
            self.prefilling.append(seq)

    def _complete_shared(self) -> None:
        """Sequences whose prompt rows were copied from a donor (shared_prompt.py) complete their prefill once they
        are the oldest in prefill (their region is then the first after the running ones)."""
        while self.prefilling and self.prefilling[0].shared_last is not None:
            seq = self.prefilling[0]
            last, seq.shared_last = seq.shared_last, None
            self._prefill_done(seq, last)

    def _proposer(self, seq: Sequence):
        eos = self.gen.eos_ids
        if seq.method == "none" or seq.max_k == 0:
            return None
        if seq.method in ("ngram", "auto"):  # #51: batched passes verify chains; auto drafts n-gram chains here
            return NgramProposer(eos, **seq.request.ngram_sizes)
        seq.draft = self.drafts.acquire()
        # lazy: the draft is prefilled on the request's first drafting step, never if the plans never draft it
        draft = DraftModelProposer(seq.draft, seq.request.sampling, seq.rng, self.gen.vocab_size, lazy=True)
        if seq.method == "draft":
            return draft
        from specrt.runtime.proposers import hybrid

        sizes = {"min_n": hybrid.DEFAULT_MIN_N, "max_n": hybrid.DEFAULT_MAX_N, **seq.request.ngram_sizes}
        return hybrid.HybridProposer(NgramProposer(eos, **sizes), draft)

    # ------------------------------------------------------------------------------------ step
    def step(self) -> None:
        t0, tokens0 = time.perf_counter(), self.step_tokens
        self._admit()
        self._complete_shared()
        prepared = self._prepare() if self.running else None
        self._planned, self._plans, self._drafted = 0.0, None, False
        if prepared is not None and self._packed_step_due(prepared):
            self._decode_step(prepared, packed=True)  # the prompt chunks of the requests in prefill ride along
        else:
            if self.prefilling:
                self._prefill()
                prepared = None  # requests may have joined: prepare again
            if self.running:
                self._decode_step(prepared or self._prepare())
        if self._planned > 0:  # realized over predicted goodput of the family used (prefill work included)
            self._calibrate((self.step_tokens - tokens0) / max(time.perf_counter() - t0, 1e-9))
        self._retire()

    def _calibrate(self, realized: float) -> None:
        """Fold this step's realized / predicted goodput into its family's calibration: the drafting one when the
        step drafted, else the plain one, and then the drafting one drifts CALIBRATION_RELAX of the way back to
        the plain one (not tried lately: drafting is retried once the drift has undone a disappointment); the
        other family's two calibrations drift the same way toward this family's."""
        table = self.spec_calibration if self._drafted else self.calibration
        table[self.family] = (CALIBRATION_DECAY * table[self.family]
                              + (1 - CALIBRATION_DECAY) * realized / self._planned)
        if not self._drafted:
            plain, spec = self.calibration[self.family], self.spec_calibration[self.family]
            self.spec_calibration[self.family] = spec + CALIBRATION_RELAX * (plain - spec)
        # unknown lately, the other family is assumed to err as this one does: one early disappointment (steps with
        # prefill work riding along) does not keep it off for the rest of a run
        other = "packed" if self.family == "fused" else "fused"
        for t in (self.calibration, self.spec_calibration):
            t[other] += CALIBRATION_RELAX * (t[self.family] - t[other])

    def _prepare(self) -> tuple[list[int], list, list[float]]:
        """(max k, the free n-gram proposal or None, drafting cost) per decoding request, for the step's plan."""
        seqs, cap = self.running, self.gen.max_seq_len
        max_ks = [0 if s.proposer is None else max(0, min(s.max_k, s.remaining - 1, cap - s.n - 1)) for s in seqs]
        # free proposals (n-gram, hybrid's n-gram branch when it matches) cost nothing: make them first, so that k is
        # capped by what matched, and estimate acceptance per kind of proposal (n-gram: its match size; a draft
        # model's: DRAFT_KIND, so that hybrid's n-gram judgements do not price its draft model, nor the reverse)
        for i, s in enumerate(seqs):
            if s.policy is not None:  # seeded: the policy's k, asked once per step (`_prepare` may run twice)
                if s.forced_k is None:
                    s.forced_k = max(0, min(s.policy.next_k(), max_ks[i]))
                max_ks[i] = s.forced_k
        free = []
        for i, (s, mk) in enumerate(zip(seqs, max_ks)):
            propose = getattr(s.proposer, "free_propose", None) if mk > 0 else None
            f = _chain(propose(s.tokens, s.n, mk)) if propose is not None else None  # batches verify chains
            s.kind = s.proposer.matched if f is not None else (DRAFT_KIND if s.draft is not None else None)
            if f is not None:
                max_ks[i] = f.token_ids.size
            free.append(f)
        if len(seqs) > 1:  # with others in the batch, a draft model that sat out many tokens is not restarted when
            # its catch-up (a prefill of those tokens, the whole prompt on its first draft) would cost more than a
            # batched pass (priced at the one-token draft cost: an upper bound), since it holds every request
            limit = self.costs.t_batch(len(seqs))
            max_ks = [0 if f is None and s.draft is not None and s.policy is None
                      and (s.n - 1 - s.draft.length) * self.costs.draft_token > limit else mk
                      for s, mk, f in zip(seqs, max_ks, free)]
        dcost = [self.costs.draft_token if s.draft is not None and f is None else 0.0 for s, f in zip(seqs, free)]
        return max_ks, free, dcost

    def _packed_step_due(self, prepared) -> bool:
        """Whether the packed pass runs this step: possible with two requests or more decoding, or one with prompts
        to prefill (their chunks ride in the pass, and a closed-loop client's next request does not switch sessions
        twice). A target without the one-token batched pass (min_rows > 1) then always takes it. Otherwise the two
        families of passes, packed and fused (batched / separate, on the target's own session), are compared by
        predicted goodput, each family's prediction scaled by its realized / predicted goodput so far (the cost
        tables are measured on short contexts without prefill work, and acceptance estimates err), smoothed over
        steps (RATIO_DECAY), and the family in use changes to packed only when it
        predicts SWITCH_MARGIN more, after MIN_FAMILY_STEPS in the other: each switch between the two ONNX Runtime
        sessions costs a pass's worth of contention (the idle session's pool threads still spin; measured with
        per-step decisions: 20 switches in 128 steps, 0.83-0.88x plain batching on SmolLM2 fp32 at 8 clients).
        The way back to the fused family asks a smaller margin (LEAVE_MARGIN): the packed pass's predictions carry
        the drafts' acceptance estimates, which are the less certain."""
        if not (self.packed and self.costs.packed and self.running and len(self.running) + bool(self.prefilling) >= 2):
            self.family, self.family_steps = "fused", 0
            return False
        if self.batched_decode:
            max_ks, _, dcost = prepared
            acceptance = [s.acceptance for s in self.running]
            packed_plan = plan_packed(acceptance, max_ks, dcost, self.costs)
            fused_plan = plan_step(acceptance, max_ks, dcost, self.costs, True)
            self._plans = (prepared, packed_plan, fused_plan)  # `_decode_step` uses the one chosen
            g_packed, g_fused = packed_plan.goodput, fused_plan.goodput
            # the ratio smoothed over steps (one step's n-gram matches say little) and a minimum stay per family
            ratio = g_packed * self.calibration["packed"] / max(g_fused * self.calibration["fused"], 1e-9)
            self.packed_ratio = RATIO_DECAY * self.packed_ratio + (1 - RATIO_DECAY) * ratio
            self.family_steps += 1
            use = self.family == "packed"
            if self.switch_free:  # both sessions on one thread pool: a switch costs nothing, each step its best
                use = ratio > 1.0
            elif self.family_steps >= MIN_FAMILY_STEPS:
                if use:  # leave for a smaller margin: staying in the worse family costs every step
                    use = self.packed_ratio * LEAVE_MARGIN >= 1.0
                else:
                    use = self.packed_ratio >= SWITCH_MARGIN
            if use != (self.family == "packed"):
                self.family, self.family_steps = ("packed" if use else "fused"), 0
        else:
            self.family = "packed"
        return self.family == "packed"

    def _prefill_chunks(self) -> list[tuple[Sequence, np.ndarray]]:
        """This step's prompt chunks: the prompt-token budget spent on the requests in prefill, oldest first."""
        chunks, budget = [], self.prefill_chunk
        for seq in self.prefilling:
            if budget <= 0 or self.sharing.blocked(seq):
                break
            ids = seq.prompt_ids[seq.prefilled:seq.prefilled + budget]
            budget -= ids.size
            chunks.append((seq, ids))
        return chunks

    def _prefill(self) -> None:
        for seq, ids in self._prefill_chunks():
            self._prefill_chunk(seq, ids)

    def _prefill_chunk(self, seq: Sequence, ids: np.ndarray) -> None:
        t0 = time.perf_counter()
        last = seq.target.forward_last(ids)
        seq.prefilled += ids.size
        seq.stats.target_calls += 1
        seq.stats.prefill_seconds += time.perf_counter() - t0
        if seq.prefilled == seq.prompt_ids.size:
            self._prefill_done(seq, last)

    def _prefill_done(self, seq: Sequence, last: np.ndarray) -> None:
        """The prompt is in the cache: pick the first token from its last row's logits; decode from the next step."""
        self.sharing.on_prefilled(seq, last)
        first = pick_token(last, seq.request.sampling, seq.rng)
        seq.tokens[seq.n] = first
        seq.n += 1
        if seq.proposer is not None and first not in self.gen.eos_ids:
            seq.proposer.start(seq.tokens, seq.n, None)
        seq.stats.new_tokens = 1
        self.prefilling.remove(seq)  # the oldest in prefill: its region is d, the first after the running ones
        self._emit(seq, [first])
        if seq.finished or seq.cancel.is_set():  # its first token ended it (EOS, max_new_tokens=1, a stop string
            # its caller saw, a client gone): no decode step, as alone
            self._finish(seq, seq.finished or "cancelled")
            return
        self.running.append(seq)

    def _decode_step(self, prepared, packed: bool = False) -> None:
        t0 = time.perf_counter()
        seqs = self.running
        max_ks, free, dcost = prepared
        acceptance = [s.acceptance for s in seqs]
        planned = self._plans if self._plans is not None and self._plans[0] is prepared else None
        if packed:
            plan = planned[1] if planned else plan_packed(acceptance, max_ks, dcost, self.costs)
        else:
            plan = planned[2] if planned else plan_step(acceptance, max_ks, dcost, self.costs, self.batched_decode)
        plan = self._spec_or_plain(plan, acceptance, dcost, packed)
        plan = self._probe(seqs, plan, max_ks, free)
        plan = _seeded(seqs, plan, max_ks)
        self._drafted = any(plan.ks)
        emitted = self._packed_step(seqs, plan.ks, free) if packed else self._passes(seqs, plan, free)
        self._planned = plan.goodput
        self.steps += 1
        self.step_tokens += emitted
        self.step_seconds += time.perf_counter() - t0

    def _spec_or_plain(self, plan: StepPlan, acceptance: list[float], dcost: list[float], packed: bool) -> StepPlan:
        """The plan, or the same family's plain plan (every k 0) when the drafting plan's prediction, scaled by
        the realized / predicted goodput of this family's drafting steps so far, falls below the plain plan's
        scaled by that of its plain steps. The cost table prices a drafting pass from short-context timings and
        the acceptance estimates are per request; how far a drafting step's realized goodput falls short of its
        prediction is measured apart, so a batch where drafting disappoints stops drafting (SmolLM2 fp32, 4-8
        clients: 0.90-0.93x plain batching before) and drafts again once the calibration has drifted back
        (CALIBRATION_RELAX per plain step)."""
        if not any(plan.ks):
            return plan
        zeros = [0] * len(plan.ks)
        if packed:
            plain = plan_packed(acceptance, zeros, dcost, self.costs)
        else:
            plain = plan_step(acceptance, zeros, dcost, self.costs, self.batched_decode)
        family = "packed" if packed else "fused"
        if plan.goodput * self.spec_calibration[family] >= plain.goodput * self.calibration[family]:
            return plan
        return plain

    def _probe(self, seqs: list[Sequence], plan: StepPlan, max_ks: list[int], free: list) -> StepPlan:
        """A request whose drafts cost something (a draft model) is judged only when it drafts: planned at k = 0
        from a low estimate it would never draft again, however well its draft would now do. One that has not
        drafted for PROBE_AFTER steps drafts one token (n-gram drafts are judged every step for free: `_accept`),
        when it decodes alone only: there a draft saves a whole pass, while with other requests in the batch a
        probe's catch-up of the tokens its draft sat out cost more than it found (SmolLM2 fp32 + int4 draft, 2
        clients: 0.85x plain batching probing, 0.90x not)."""
        ks = list(plan.ks)
        alone = len(seqs) == 1 and not plan.packed  # one request decoding: the single-sequence loop
        for i, (s, k, mk, f) in enumerate(zip(seqs, ks, max_ks, free)):
            if s.draft is None or f is not None:
                continue
            if k == 0 and s.idle + 1 >= PROBE_AFTER and mk > 0 and alone:
                ks[i] = 1
            s.idle = 0 if ks[i] > 0 else s.idle + 1
        return plan if ks == plan.ks else dataclasses.replace(plan, ks=ks)

    def _passes(self, seqs: list[Sequence], plan: StepPlan, free: list) -> int:
        """The batched and separate regimes: a pass of its own for every request that speculates (every request,
        when not batched), then the batched one-token pass when the plan has it."""
        emitted = 0
        for s, k, f in zip(seqs, plan.ks, free):
            if k > 0:
                prop = _first(f, k) if f is not None else _chain(s.proposer.propose(s.tokens, s.n, k))
                emitted += self._verify(s, k, prop)
            elif not plan.batched:
                emitted += self._verify(s, 0, None, f)
        if plan.batched:
            emitted += self._batched_token(seqs, plan, free)
        return emitted

    def _verify(self, s: Sequence, k: int, prop, free=None) -> int:
        """One pass over the pending token and the drafts in s's own region, then the loop's acceptance rule.
        `free`: an n-gram proposal not used this step, judged against the token picked (acceptance estimate)."""
        drafts = prop.token_ids if prop is not None else np.empty(0, np.int64)
        if prop is not None:
            s.stats.draft_calls += prop.calls
        logits = s.target.forward(np.concatenate([s.tokens[s.n - 1:s.n], drafts]))  # [kk + 1, V]
        s.stats.target_calls += 1
        return self._accept(s, k, prop, logits, free)

    def _packed_step(self, seqs: list[Sequence], ks: list[int], free: list) -> int:
        """ONE packed pass: every request's pending token and drafts in its own region (its call alone; a target
        that pads calls to min_rows gets the padding in attention only), and the prompt chunks of the requests in
        prefill, then each request's acceptance rule."""
        calls, metas, written = [], [], []  # written: (sequence, its cache length once the pass has run)
        for s, k, f in zip(seqs, ks, free):
            prop = None
            if k > 0:
                prop = _first(f, k) if f is not None else _chain(s.proposer.propose(s.tokens, s.n, k))
                s.stats.draft_calls += prop.calls
            drafts = prop.token_ids if prop is not None else np.empty(0, np.int64)
            ids = np.concatenate([s.tokens[s.n - 1:s.n], drafts])
            runner, real = s.target, ids.size
            past = runner.length
            runner.cache.reserve(real)  # the attention padding stays within the capacity (`PackedPass.run`)
            calls.append((self.targets.region_of(runner), ids, past, (0, real), runner.min_rows))
            metas.append((s, k, prop, f))
            written.append((s, past + real))
        prefills = []
        for seq, ids in self._prefill_chunks():
            past = seq.target.length
            seq.target.cache.reserve(ids.size)
            calls.append((self.targets.region_of(seq.target), ids, past, (ids.size - 1, 1)))
            prefills.append((seq, ids.size))
            written.append((seq, past + ids.size))
        t0 = time.perf_counter()
        outs = self.targets.packed().run(calls)  # min_rows padding in attention only (`PackedPass.run`)
        seconds = time.perf_counter() - t0
        # Every call's rows are committed before any request may leave: one that ends at its first token frees
        # its region at once, and the regions above move down with their committed rows only (`RegionPool.release`).
        for seq, length in written:
            seq.target.cache.length = length
            seq.stats.target_calls += 1
        emitted = 0
        for (s, k, prop, f), logits in zip(metas, outs):
            emitted += self._accept(s, k, prop, logits, f)
        for (seq, n), logits in zip(prefills, outs[len(metas):]):
            seq.prefilled += n
            seq.stats.prefill_seconds += seconds
            if seq.prefilled == seq.prompt_ids.size:
                self._prefill_done(seq, logits[0])
        return emitted

    def _accept(self, s: Sequence, k: int, prop, logits: np.ndarray, free) -> int:
        """The loop's acceptance rule over the logits of s's pending token and drafts ([kk + 1, V])."""
        params = s.request.sampling
        drafts = prop.token_ids if prop is not None else np.empty(0, np.int64)
        kk = drafts.size
        if kk == 0:
            j, nxt = 0, pick_token(logits[-1], params, s.rng)
            if free is not None and free.token_ids.size:
                s.observe_acceptance(1, int(int(free.token_ids[0]) == nxt))
        elif params.greedy:
            j, nxt = greedy_accept(drafts, logits)
        else:
            q = warp(logits, params)
            p = prop.probs
            if p is not None and p.shape[1] > q.shape[1]:
                q = np.pad(q, ((0, 0), (0, p.shape[1] - q.shape[1])))
            j, nxt = rejection_sample(drafts, p, q, s.rng)
        s.stats.record_step(k, kk, j, getattr(prop, "source", "") if prop is not None else "")
        s.stats.num_speculative_tokens = k
        if kk:
            s.observe_acceptance(kk, j)
        _policy_update(s, k, kk, j)
        return self._commit(s, drafts[:j].tolist() + [int(nxt)], j)

    def _batched_token(self, seqs: list[Sequence], plan: StepPlan, free: list) -> int:
        """One batched one-token pass over every decoding request; each unfinished one gets one more token."""
        pending = np.array([s.tokens[s.n - 1] for s in seqs], np.int64)
        rows = self.targets.decode_batch(pending)  # [B, V], a view valid until the next batched pass
        emitted = 0
        for s, row, k, f in zip(seqs, rows, plan.ks, free):
            if s.finished:  # ended by its own pass this step: its row is discarded (its region is released)
                continue
            if k and s.policy is not None:  # seeded, its step done by its own pass: a token more would draw a random
                s.target.truncate(s.n - 1)  # number its run alone does not; the row is discarded
                continue
            s.stats.target_calls += 1
            nxt = pick_token(row, s.request.sampling, s.rng)
            if k == 0:
                s.stats.record_step(0, 0, 0, "")
                s.stats.num_speculative_tokens = 0
                _policy_update(s, 0, 0, 0)
                if f is not None and f.token_ids.size:  # the free n-gram draft judged against the token picked
                    s.observe_acceptance(1, int(int(f.token_ids[0]) == nxt))
            emitted += self._commit(s, [nxt], 0)
        return emitted

    def _commit(self, s: Sequence, emitted: list[int], accepted: int) -> int:
        """Append `emitted` (cut after an EOS) to s; its target holds every committed token but the last."""
        for i, t in enumerate(emitted):
            if t in self.gen.eos_ids:
                emitted = emitted[:i + 1]
                break
        s.tokens[s.n:s.n + len(emitted)] = emitted
        s.n += len(emitted)
        s.target.truncate(s.n - 1)
        if s.proposer is not None:
            s.proposer.observe(s.n, accepted, None)
        s.stats.new_tokens += len(emitted)
        self._emit(s, emitted)
        return len(emitted)

    def _emit(self, s: Sequence, ids: list[int]) -> None:
        s.stats.elapsed_s = time.perf_counter() - s.started
        if ids[-1] in self.gen.eos_ids:
            s.finished = "stop"
        elif s.remaining <= 0 or s.n >= self.gen.max_seq_len:
            s.finished = "length"
        s.stats.finish_reason = s.finished
        s.emit(ids, s)

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
            if s.cancel.is_set():
                self.prefilling.remove(s)
                done.append((s, "cancelled"))
        # highest region first: freeing a region moves every region above it down one (a fused pool copies their
        # valid KV rows), so requests that end in the same step are freed without moving one another
        done.sort(key=lambda d: self.targets.region_of(d[0].target), reverse=True)
        for s, reason in done:
            self._finish(s, reason)
        for s in list(self.waiting):
            if s.cancel.is_set():
                self.waiting.remove(s)
                self._finish(s, "cancelled", release=False)

    def _finish(self, s: Sequence, reason: str, release: bool = True) -> None:
        self.sharing.on_finish(s)
        if release:
            self.targets.release(s.target)
            if s.draft is not None:
                self.drafts.release(s.draft)
        s.target = s.draft = s.proposer = None
        s.finished = s.stats.finish_reason = reason
        s.emit([], s)  # the end: an empty chunk with the final stats


def _seeded(seqs: list[Sequence], plan: StepPlan, max_ks: list[int]) -> StepPlan:
    """The plan with every seeded request's k set to its policy's (capped by what its free proposal matched,
    `_prepare`): its step draws the random numbers of the same step alone. In a batched plan such a request that
    drafts skips the batched token (`_batched_token`), so each of its steps stays one step of the loop alone."""
    ks = [mk if s.policy is not None else k for s, k, mk in zip(seqs, plan.ks, max_ks)]
    return plan if ks == plan.ks else dataclasses.replace(plan, ks=ks)


def _policy_update(s: Sequence, k: int, drafted: int, accepted: int) -> None:
    """A seeded request's step is over: its policy learns from the counts (never timings: CountOnlyAdaptiveK)."""
    if s.policy is not None:
        s.policy.update(k, drafted, accepted, 0.0, 0.0)
        s.forced_k = None


def _chain(prop):
    """A token tree's first chain (docs/trees.md: batched passes verify chains), None and chains unchanged."""
    return prop.chain() if prop is not None else None


def _first(prop, k: int):
    """The first k tokens of a point-mass proposal (an n-gram proposal made for the largest k)."""
    if prop.token_ids.size <= k:
        return prop
    return dataclasses.replace(prop, token_ids=prop.token_ids[:k])
