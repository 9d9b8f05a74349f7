"""`load(bundle)` -> `Generator`: the Python API.

    gen = load("artifacts/my-pair")                  # backend="auto" | "ort" | "torch" | "trt"
    res = gen.generate("def fib(n):", max_new_tokens=128, method="draft", num_speculative_tokens=5)
    res = gen.generate("def fib(n):", request=GenerationRequest(max_new_tokens=128, temperature=0.7))
    res.text, res.token_ids, res.stats.acceptance_rate
    for piece in gen.stream("def fib(n):", max_new_tokens=64): print(piece, end="")

Every argument is validated before a backend runs, so a bad call raises `InvalidArgument` and leaves
the generator usable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from specrt.bundle.manifest import Manifest, read_manifest, verify_files
from specrt.core.errors import InvalidArgument
from specrt.core.tokenizer import TextStage, Tokenizer
from specrt.runtime import backends
from specrt.runtime.arguments import check_threads, prompt_ids
from specrt.runtime.exclusive import GenerationLock, Steps
from specrt.runtime.loop import decode
from specrt.runtime.logits_processors import LogitsState
from specrt.runtime.policy import AdaptiveK, CountOnlyAdaptiveK, FixedK, KPolicy, model_draft_cost
from specrt.runtime.proposers.base import Proposer
from specrt.runtime.proposers.draft_model import DraftModelProposer
from specrt.runtime.proposers.ngram import NgramProposer
from specrt.runtime.request import METHODS, GenerationRequest, generation_defaults
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.stats import GenerationStats
from specrt.runtime.warmup import warm_up

HOOKS = ("proposer", "policy", "on_step")  # call options that are objects, not request fields
SMALL_DRAFT_PARAMETERS = 50_000_000


@dataclasses.dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # the new tokens only
    prompt_token_ids: list[int]
    stats: GenerationStats
    finish_reason: str
    logprobs: list | None = None  # with request.logprobs: a TokenLogprob per new token (runtime/logits_processors.py)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict()}


def load(bundle: str | Path, backend: str = "auto", *, threads: int | None = None,
         target_device: str | None = None, draft_device: str | None = None,
         verify_checksums: bool = True, warmup: bool = True) -> "Generator":
    """Open a compiled bundle: validate its manifest and checksums, then create the runners.

    bundle            the directory written by `specrt compile` / `compile_bundle`
    backend           "auto" | "ort" | "torch" | "trt" | "ort-cuda" | "ort-trt" (see runtime/backends)
    threads           CPU threads per model (default: all cores; a small draft runs on one)
    target_device, draft_device   e.g. "cpu", "cuda:0", "cuda:1" (draft and target may differ)
    verify_checksums  check the sha256 of every file this backend opens, before it opens any (every listed
                      file's presence and size is always checked; graph variants the backend never opens are
                      not hashed: an int4 bundle's fp32 graphs, ~7 s of SmolLM2's cold start)
    warmup            run and time every verify shape now (False: on the first call that needs the timings,
                      an adaptive-k speculative call; a one-shot `specrt generate` starts faster)
    Raises BundleError / ChecksumMismatch / VersionMismatch / BackendUnavailable with the fix in the message.
    """
    check_threads(threads)  # before the bundle is read
    manifest = read_manifest(bundle, verify_checksums=False)  # sizes, paths, values; sha256 below
    return Generator(manifest, backend=backend, threads=threads, target_device=target_device,
                     draft_device=draft_device, warmup=warmup, verify_checksums=verify_checksums)


def open_batch_runner(bundle: str | Path, role: str = "target", backend: str = "ort-portable", *, max_batch: int = 8,
                      threads: int | None = None, device: str | None = None, verify_checksums: bool = True):
    """One model of a bundle as a `BatchRunner` (runtime/backends/batch.py): several sequences per pass on the
    batched portable graph, "ort-portable" (ONNX Runtime, CPU), "torch" (the PyTorch reference, CPU or CUDA) or
    "trt" (engines compiled with `--max-batch`).
    The manifest and the checksums of the files it opens are checked first, as by `load`."""
    check_threads(threads)
    manifest = read_manifest(bundle, verify_checksums=False)
    if role not in manifest.models:
        raise InvalidArgument(f"the bundle has no {role!r} model (it has {', '.join(manifest.models)})")
    if verify_checksums:
        verify_files(manifest, backends.files_to_verify(manifest, backend))
    return backends.create_batch_runner(manifest, role, backend, max_batch=max_batch, threads=threads, device=device)


class Generator:
    """A loaded bundle: target (and draft) runners, tokenizer and per-method k policies.

    One generation runs at a time per Generator (runners hold KV state); `generate`, `stream` and
    `stream_tokens` share the options documented on `generate`.
    """

    def __init__(self, manifest: Manifest, backend: str = "auto", *, threads: int | None = None,
                 target_device: str | None = None, draft_device: str | None = None, warmup: bool = True,
                 verify_checksums: bool = False) -> None:
        threads = check_threads(threads)
        self.manifest = manifest
        self.backend = backends.resolve_backend(backend, manifest)
        self.threads, self.target_device = threads, target_device  # the batch engine's runner uses the same
        if verify_checksums:  # load(): the files this backend opens, before any of them is opened
            verify_files(manifest, backends.files_to_verify(manifest, self.backend))
        self.max_seq_len = manifest.max_seq_len
        self.max_draft_tokens = manifest.max_draft_tokens
        tok = manifest.tokenizer
        self.eos_ids = frozenset(int(t) for t in tok.eos_token_ids)
        self.bos_id = tok.bos_token_id
        short = self.max_draft_tokens + 2
        draft_entry = manifest.models.get("draft")
        # A small draft runs fastest on one thread (no pool synchronisation per tiny matmul); a larger one
        # gets a thread pool too, and then the two sessions must not spin against each other.
        small = draft_entry is not None and (draft_entry.num_parameters or 0) < SMALL_DRAFT_PARAMETERS
        draft_threads = 1 if small else threads
        alternating = draft_entry is not None and (draft_threads or backends.default_threads()) > 1

        def target_runner():
            return backends.create_runner(manifest, "target", self.backend, capacity=self.max_seq_len,
                                          max_short_tokens=short, threads=threads,
                                          want_hidden=manifest.medusa is not None or manifest.draft_head is not None,
                                          device=target_device, alternating=alternating)

        def tokenizer():
            return Tokenizer(manifest.path(tok.path))

        if self.backend == "ort":  # the tokenizer loads while ONNX Runtime initializes the target's session
            from specrt.runtime.backends.ort.overlap import alongside

            self.target, self.tokenizer = alongside(target_runner, tokenizer)
        else:
            self.tokenizer = tokenizer()
            self.target = target_runner()
        self.vocab_size = self.target.vocab_size
        self.draft = None
        if draft_entry is not None:
            self.draft = backends.create_runner(manifest, "draft", self.backend, capacity=self.max_seq_len,
                                                max_short_tokens=short, threads=draft_threads,
                                                device=draft_device, alternating=alternating)
        self.sampling_defaults = generation_defaults(manifest.root) if manifest.root is not None else {}
        self._medusa_cache: dict = {}  # the heads session, created on first use
        self._head_runner = None  # the draft head's session and cache (draft_head bundles), created on first use
        self._policies: dict = {}  # AdaptiveK per (method, max k), kept across calls
        self._constraints = None  # ConstraintCompiler and MaskWorker, built on the first constrained call
        self._load_costs = None  # (verify seconds per k, draft seconds), from warmup()
        if warmup:
            self.warmup()
        self._lock = GenerationLock()  # one generation at a time per Generator (runners hold state; exclusive.py)

    def warmup(self) -> None:
        """Run and time every verify shape (see warmup.py): first-use costs stay out of later timings, and
        the adaptive policy starts from the measured costs."""
        self._load_costs = warm_up(self.target, self.draft, self.max_draft_tokens)

    # ----------------------------------------------------------------------------------------- API
    @property
    def methods(self) -> list[str]:
        out = ["none", "ngram", "recycle"]
        if self.draft is not None:
            out[0:0] = ["draft", "hybrid"]
        if self.manifest.medusa is not None:
            out.append("medusa")
        if self.manifest.draft_head is not None:
            if self.draft is not None:  # hybrid is n-gram + the draft model here; hybrid-head: n-gram + the head
                out += ["head", "hybrid-head"]
            else:  # n-gram where the context matches, else the head (hybrid-head: the same here)
                out[0:0] = ["hybrid", "head"]
                out.append("hybrid-head")
        return out + ["auto"]  # #51: every source in one tree sized by goodput (runtime/proposers/auto.py)

    @property
    def default_method(self) -> str:
        if self.manifest.draft_head is not None and self.draft is None:
            return "hybrid"  # a draft head is not a source of auto's trees yet
        return "auto"  # #51: never a method that loses to another the bundle has (docs/drafting.md)

    def engine(self, max_batch: int = 8):
        """A continuous-batching engine on this generator's weights: several requests decode together
        (`generate_batch([...])`, `stream_tokens(...)` from any thread; runtime/batch/engine.py, docs/batching.md).
        Close it when done (requests it still holds then end with EngineClosed); this Generator stays usable for
        single calls meanwhile (its own KV cache). `max_batch` slots' KV cache must fit in the memory available
        (InvalidArgument with the numbers otherwise, before anything is allocated: runtime/batch/memory.py)."""
        from specrt.runtime.batch.engine import BatchEngine

        return BatchEngine(self, max_batch=max_batch)

    def request(self, public: str = "generate", max_new_tokens: int | None = None,
                request: GenerationRequest | None = None, **options: Any) -> GenerationRequest:
        """The resolved `GenerationRequest` of a call: `request` or the keyword options (not both), with
        `max_new_tokens` when given, omitted sampling fields from the bundle's generation_config (else greedy),
        checked against the bundle (k, method). Raises InvalidArgument / TypeError before any runner runs."""
        if request is None:
            request = GenerationRequest.from_options(f"Generator.{public}", **options)
        elif not isinstance(request, GenerationRequest):
            raise InvalidArgument(f"request must be a GenerationRequest, got {type(request).__name__}")
        elif options:
            raise TypeError(f"Generator.{public}() takes either request= or keyword options, not both "
                            f"(got {', '.join(options)})")
        if max_new_tokens is not None:
            request = request.replace(max_new_tokens=max_new_tokens)
        request = request.with_defaults(self.sampling_defaults)
        request.check_for(self.max_draft_tokens, self.methods)
        return request

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int | None = None, *,
                 request: GenerationRequest | None = None, **options: Any) -> GenerationResult:
        """Generate up to `max_new_tokens` tokens (default 128) after `prompt` (text, or a sequence of token ids).

        The request: `request=GenerationRequest(...)` or its fields as keyword options (runtime/request.py;
        all validated before any backend runs; a bad value raises InvalidArgument):
          temperature (0 = greedy), top_k (0 = off), top_p (1 = off): omitted ones come from the bundle's
                            generation_config.json, else greedy; seed (reproducible sampling)
          method            "draft" | "ngram" | "hybrid" | "medusa" | "head" | "hybrid-head" | "recycle" | "none"
                            (default: draft if the bundle has one, else hybrid with a draft head; hybrid = n-gram
                            where the context has a match, else the draft model, or the draft head in a bundle
                            without a draft model;
                            hybrid-head = n-gram, else the draft head; recycle = n-gram branches merged with the
                            target's own successor table, Token Recycling: runtime/proposers/recycle.py)
          num_speculative_tokens   k, an int in [0, max_draft_tokens] or "auto" (adaptive; the default)
          ngram_min, ngram_max     n-gram match lengths for methods "ngram" (default 1, 3) and "hybrid" (2, 3)
          stop              stop strings: the text is cut before the first one, the generation ends with the step
                            that reached it (finish_reason "stop"; token_ids hold that step's tokens)
          strict            refuse a prompt + max_new_tokens beyond the context (default: stop at it)
          presence_penalty, frequency_penalty (OpenAI, [-2, 2]), repetition_penalty (vLLM, (0, 2]), logit_bias
                            ({token id: [-100, 100]}): applied to every verified position (docs/requests.md)
          logprobs          N in [0, 20]: the result's `logprobs` holds each new token's logprob and top N
        Hooks (keyword options, not request fields):
          proposer          a Proposer object to draft with instead of `method`'s (e.g. a custom one)
          policy            a KPolicy object choosing k per step instead of `num_speculative_tokens`
          on_step           callable(k, drafted, accepted) called after every speculative step
          constraint        a ConstraintSpec (runtime/constraint.py: JSON schema, json_object, regex, grammar):
                            the output matches it; a spec the library cannot compile raises ConstraintError
          forced_tokens     with a constraint and a drafting method: verify the tokens it forces in the same
                            pass as the drafts (default True; output is the same either way)
        Returns a GenerationResult (text, new token ids, stats, finish_reason "stop" or "length").
        """
        steps, stops = self._iterate("generate", prompt, max_new_tokens, request, options)
        stage = TextStage(self.tokenizer, stops) if stops else None
        ids: list[int] = []
        parts: list[str] = []
        with contextlib.closing(steps):
            for chunk, prompt_ids, stats in steps:
                ids.extend(chunk)
                if stage is not None:
                    parts.append(stage.push(chunk))
                    if stage.stopped:  # the generation ends with this step (no tokens after it)
                        break
        if stage is None:
            text = self.tokenizer.decode(ids)
        else:
            text = "".join(parts) + stage.finish()
            if stage.stopped:
                stats.finish_reason = "stop"
        logprobs = list(stats.token_logprobs) if stats.token_logprobs else None
        if logprobs is not None and stage is not None and stage.stopped:
            logprobs = logprobs[:len(ids)]  # the steps after the stop string's are not run
        return GenerationResult(text, ids, prompt_ids, stats, stats.finish_reason, logprobs)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int | None = None, *,
               request: GenerationRequest | None = None, **options: Any) -> Iterator[str]:
        """Yield text pieces as tokens are accepted (incremental detokenization, cut before a stop string);
        options as `generate`. A stream left half-read does not block other calls (runtime/exclusive.py)."""
        steps, stops = self._iterate("stream", prompt, max_new_tokens, request, options)
        stage = TextStage(self.tokenizer, stops)
        with contextlib.closing(steps):
            for chunk, _, stats in steps:
                piece = stage.push(chunk)
                if stage.stopped:
                    stats.finish_reason = "stop"
                if piece:
                    yield piece
                if stage.stopped:
                    return
            tail = stage.finish()
            if stage.stopped:
                stats.finish_reason = "stop"
            if tail:
                yield tail

    def stream_tokens(self, prompt: str | Sequence[int], max_new_tokens: int | None = None, *,
                      request: GenerationRequest | None = None, **options: Any):
        """Yield (new token ids, stats) per step; the stats object is complete after the last step.
        Options as `generate`; with stop strings the generation ends with the step whose text reaches one
        (finish_reason "stop"; the ids are not cut: a caller that wants the cut text runs a `TextStage`)."""
        steps, stops = self._iterate("stream_tokens", prompt, max_new_tokens, request, options)
        stage = TextStage(self.tokenizer, stops) if stops else None
        with contextlib.closing(steps):
            for chunk, _, stats in steps:
                if stage is not None:
                    stage.push(chunk)
                    if stage.stopped:
                        stats.finish_reason = "stop"
                yield chunk, stats
                if stage is not None and stage.stopped:
                    return
            if stage is not None:
                stage.finish()
                if stage.stopped:
                    stats.finish_reason = "stop"

    # ----------------------------------------------------------------------------------- internals
    def encode_prompt(self, prompt: str | Sequence[int]) -> np.ndarray:
        """Token ids [N] of `prompt` (text or ids), checked against the vocabulary and the context length."""
        return prompt_ids(prompt, self.tokenizer, self.bos_id, self.vocab_size, self.max_seq_len)

    def check_room(self, prompt_ids: np.ndarray, request: GenerationRequest) -> None:
        """A strict request whose prompt + max_new_tokens passes the context is refused (else it stops there)."""
        room = self.max_seq_len - int(prompt_ids.size)
        if request.strict and request.max_new_tokens > room:
            raise InvalidArgument(
                f"prompt has {prompt_ids.size} tokens: with max_new_tokens={request.max_new_tokens} it exceeds the "
                f"bundle's context of {self.max_seq_len} tokens (at most {room} new tokens fit)")

    def make_policy(self, k: int | str, method: str, seeded: bool = False):
        """The speculation-length policy for `k` (an int or "auto") and `method` (used by the loop and bench).

        `seeded`: the call samples with a seed, so "auto" must not depend on timings (see CountOnlyAdaptiveK in
        policy.py); greedy calls are never `seeded` (their output does not depend on k)."""
        max_k = self.max_draft_tokens
        if method == "auto":  # #51: the proposer sizes the tree; k caps its nodes
            from specrt.runtime.proposers.auto import auto_policy

            return auto_policy(self, k, seeded)
        if method == "medusa":  # one draft per head
            max_k = min(max_k, self.manifest.medusa.num_heads)
        if k == "auto" and seeded:
            return CountOnlyAdaptiveK(max_k, model_draft_cost(method, self.manifest))
        if k == "auto":
            key = (method, max_k)
            if key not in self._policies:  # kept across calls: costs and acceptance carry over
                self._policies[key] = AdaptiveK(max_k)
                if self._load_costs is None:  # load(warmup=False): time the shapes now, before this call runs
                    self.warmup()
                verify, draft = self._load_costs
                if method != "medusa":  # start short runs at the k the load-time costs predict best
                    uses_model = method == "draft" or method == "hybrid" and self.draft is not None
                    uses_head = (not uses_model and method not in ("ngram", "recycle")
                                 and self.manifest.draft_head is not None)
                    if uses_head:  # not timed at load: the head's weight bytes against the target's (policy.py)
                        draft = model_draft_cost(method, self.manifest) * (verify[0] or 0.0)
                    self._policies[key].prime(verify, draft if uses_model or uses_head else 0.0)
            return self._policies[key]
        return FixedK(min(k, max_k))

    def compile_constraint(self, spec):
        """A fresh `Constraint` (parser state) for `spec` on this bundle's tokenizer (ConstraintError if the
        library cannot compile it). The tokenizer is converted once per Generator (~1 s)."""
        from specrt.runtime.constraint import ConstraintCompiler, ConstraintSpec
        from specrt.runtime.constrained import MaskWorker

        if not isinstance(spec, ConstraintSpec):
            raise InvalidArgument(f"constraint must be a ConstraintSpec, got {type(spec).__name__}")
        if self._constraints is None:
            text = self.manifest.path(self.manifest.tokenizer.path).read_text(encoding="utf-8")
            eos = sorted(self.eos_ids)
            self._constraints = (ConstraintCompiler(text, self.vocab_size, eos), MaskWorker())
        return self._constraints[0].compile(spec)

    def make_proposer(self, method: str, params: SamplingParams, rng: np.random.Generator, options: dict):
        """The proposer for `method` bound to this generator's runners (None for method "none")."""
        if method == "none":
            return None
        if method in ("head", "hybrid-head") or (method == "hybrid" and self.draft is None
                                                  and self.manifest.draft_head is not None):
            draft = self._head_proposer(params, rng)
            if method == "head":
                return draft
            from specrt.runtime.proposers import hybrid

            sizes = {"min_n": hybrid.DEFAULT_MIN_N, "max_n": hybrid.DEFAULT_MAX_N, **options}
            return hybrid.HybridProposer(NgramProposer(self.eos_ids, **sizes), draft)
        if method in ("draft", "hybrid"):
            if self.draft is None:
                raise InvalidArgument(f"method {method!r} needs a bundle compiled with --draft")
            draft = DraftModelProposer(self.draft, params, rng, self.vocab_size)
            if method == "draft":
                return draft
            from specrt.runtime.proposers import hybrid

            sizes = {"min_n": hybrid.DEFAULT_MIN_N, "max_n": hybrid.DEFAULT_MAX_N, **options}
            return hybrid.HybridProposer(NgramProposer(self.eos_ids, **sizes), draft)
        if method == "auto":  # #51: one tree from every source, sized by goodput (runtime/proposers/auto.py)
            from specrt.runtime.proposers.auto import make_auto

            return make_auto(self, params, rng, options)
        if method == "ngram":
            return NgramProposer(self.eos_ids, **options)
        if method == "recycle":  # prompt lookup + the bundle's successor table (runtime/proposers/recycle.py)
            from specrt.runtime.proposers.recycle import make_recycle

            return make_recycle(self, options)
        if method == "medusa":
            if self.manifest.medusa is None:
                raise InvalidArgument("method 'medusa' needs a bundle compiled with --medusa")
            from specrt.runtime.proposers.medusa import MedusaProposer

            return MedusaProposer.from_manifest(self.manifest, self._medusa_cache)
        raise InvalidArgument(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")

    def _head_proposer(self, params: SamplingParams, rng: np.random.Generator):
        if self.manifest.draft_head is None:
            raise InvalidArgument("method 'head' needs a bundle compiled with --draft head:DIR (specrt train-head)")
        from specrt.runtime.backends.head import open_head_runner
        from specrt.runtime.proposers.head import HeadProposer

        if self._head_runner is None:
            self._head_runner = open_head_runner(self.manifest, self.max_seq_len, self.backend, self.target_device)
        return HeadProposer(self._head_runner, params, rng, self.vocab_size)

    def _iterate(self, public: str, prompt, max_new_tokens: int | None, request: GenerationRequest | None,
                 options: dict):
        """Validate everything (request, hooks, prompt) before touching a runner; then the step generator."""
        hooks = {name: options.pop(name) for name in HOOKS if name in options}
        request = self.request(public, max_new_tokens, request, **options)
        proposer, policy = hooks.get("proposer"), hooks.get("policy")
        if policy is not None and not isinstance(policy, KPolicy):
            raise InvalidArgument(f"policy must implement next_k / current_k / update, got {type(policy).__name__}")
        method = getattr(proposer, "name", "custom") if proposer is not None else (request.method or self.default_method)
        k = request.num_speculative_tokens
        prompt_ids = self.encode_prompt(prompt)
        room = self.max_seq_len - int(prompt_ids.size)
        max_new_tokens = request.max_new_tokens
        self.check_room(prompt_ids, request)
        state = self.compile_constraint(request.constraint) if request.constraint is not None else None
        logits = request.logits_params
        logits.check_vocab(self.vocab_size)
        steps = Steps()  # the generation holds only a weak reference to it: dropping the stream ends it
        steps.it = self._run(prompt_ids, max_new_tokens, request.sampling, method, k, request.ngram_sizes, proposer,
                             policy, hooks.get("on_step"), max_new_tokens > room, state, request.forced_tokens,
                             weakref.ref(steps), logits if logits.active else None)
        return steps, request.stop

    def _run(self, prompt_ids, max_new_tokens, params, method, k, options, proposer, policy, on_step,
             context_limited=False, constraint=None, forced_tokens=True, steps=None, logits=None):
        rng = params.rng()
        logits_state = LogitsState(logits, self.vocab_size, prompt_ids) if logits is not None else None
        with self._lock.hold(steps):
            if proposer is None and max_new_tokens > 1:  # one token comes from the prefill: nothing to draft
                proposer = self.make_proposer(method, params, rng, options)
            if logits_state is not None and logits.changes_logits:  # drafts see the penalties (acceptance)
                for p in (proposer, getattr(proposer, "draft", None)):
                    if hasattr(p, "logits_state"):
                        p.logits_state = logits_state
            if proposer is not None and policy is None:
                policy = self.make_policy(k, method, params.seed is not None and not params.greedy)
            stats = GenerationStats(method=method, backend=self.backend, prompt_tokens=int(prompt_ids.size),
                                    provider=self.target.describe().get("provider", self.backend),
                                    context_limited=context_limited,
                                    constraint=constraint.spec.describe() if constraint is not None else "")
            if logits_state is not None:
                stats.token_logprobs = logits_state.logprobs
            started = time.perf_counter()
            explains = policy is not None and hasattr(policy, "off_reason")
            noted_off = False  # whether speculation_note describes speculation as off
            for chunk in decode(self.target, proposer, policy, prompt_ids, max_new_tokens=max_new_tokens,
                                max_draft_tokens=self.max_draft_tokens, params=params, rng=rng,
                                eos_ids=self.eos_ids, stats=stats, on_step=on_step, constraint=constraint,
                                mask_worker=self._constraints[1] if constraint is not None else None,
                                forced_tokens=forced_tokens, logits_state=logits_state):
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
