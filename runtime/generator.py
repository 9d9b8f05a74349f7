"""`load(bundle)` -> `Generator`: the Python API.

    gen = load("artifacts/my-pair")                  # backend="auto" | "ort" | "torch" | "trt"
    res = gen.generate("def fib(n):", max_new_tokens=128, method="draft", num_speculative_tokens=5)
    res = gen.generate("def fib(n):", request=GenerationRequest(max_new_tokens=128, temperature=0.7))
    res.text, res.token_ids, res.stats.acceptance_rate
    for piece in gen.stream("def fib(n):", max_new_tokens=64): print(piece, end="")
    p = gen.prepare("def fib(n):", max_new_tokens=64); gen.generate(p)   # checked once, run later
    with load("artifacts/my-pair") as gen: ...       # close(): sessions released, later calls raise GeneratorClosed

Every call is resolved once, by `prepare` (runtime/prepared.py), before a backend runs: a bad call raises
`InvalidArgument`, the generator stays usable. See also runtime/open.py, results.py, generation.py.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from specrt.bundle.manifest import Manifest, read_manifest, verify_files
from specrt.core.errors import GeneratorClosed, InvalidArgument
from specrt.runtime import backends
from specrt.runtime.arguments import check_threads, prompt_ids
from specrt.runtime.exclusive import GenerationLock
from specrt.runtime.generation import start
from specrt.runtime.open import close_models, open_constraints, open_models
from specrt.runtime.policy import AdaptiveK, CountOnlyAdaptiveK, FixedK, model_draft_cost
from specrt.runtime.prepared import PreparedRequest, prepare_call, resolve_request
from specrt.runtime.proposers.draft_model import DraftModelProposer
from specrt.runtime.request import METHODS, GenerationRequest, generation_defaults
from specrt.runtime.results import GenerationResult, collect, text_pieces, token_steps
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.warmup import warm_up

__all__ = ["GenerationResult", "Generator", "METHODS", "load"]


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


class Generator:
    """A loaded bundle: target (and draft) runners, tokenizer and per-method k policies.

    One generation runs at a time per Generator (runners hold KV state); `generate`, `stream` and
    `stream_tokens` share the options documented on `generate`. `close()` (or `with`) releases the sessions.
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
        self.eos_ids = frozenset(int(t) for t in manifest.tokenizer.eos_token_ids)
        self.bos_id = manifest.tokenizer.bos_token_id
        self.closed = False
        models = open_models(manifest, self.backend, threads, target_device, draft_device)
        self.target, self.draft, self.tokenizer = models.target, models.draft, models.tokenizer
        self.vocab_size = self.target.vocab_size
        self.sampling_defaults = generation_defaults(manifest.root) if manifest.root is not None else {}
        self._medusa_cache: dict = {}  # the heads session, created on first use
        self._head_runner = None  # the draft head's session and cache (draft_head bundles), created on first use
        self._policies: dict = {}  # AdaptiveK per (method, max k), kept across calls
        self._constraints = None  # ConstraintCompiler and MaskWorker, built on the first constrained call
        self._load_costs = None  # (verify seconds per k, draft seconds, draft k+1 rows), warmup()
        self._engines: weakref.WeakSet = weakref.WeakSet()  # BatchEngines on these weights: closed by close()
        self._lock = GenerationLock()  # one generation at a time per Generator (runners hold state; exclusive.py)
        if warmup:
            self.warmup()

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
        return "auto"  # #51: never a method that loses to another the bundle has (docs/drafting.md)

    def engine(self, max_batch: int = 8, prefix_cache_mb: float | None = None):
        """A continuous-batching engine on this generator's weights (runtime/batch/engine.py, docs/batching.md).
        Close it when done (this Generator's `close()` closes it too); this Generator stays usable for single calls
        meanwhile. `max_batch` slots' KV cache must fit in the memory available (else InvalidArgument).
        `prefix_cache_mb`: the prefix cache's budget in MiB (None: the default, 256; 0: off; docs/batching.md)."""
        from specrt.runtime.batch.engine import BatchEngine
        from specrt.runtime.prefix_budget import DEFAULT_PREFIX_CACHE_MB

        self._check_open()
        mb = DEFAULT_PREFIX_CACHE_MB if prefix_cache_mb is None else prefix_cache_mb
        engine = BatchEngine(self, max_batch=max_batch, prefix_cache_mb=mb)
        self._engines.add(engine)
        return engine

    def request(self, public: str = "generate", max_new_tokens: int | None = None,
                request: GenerationRequest | None = None, **options: Any) -> GenerationRequest:
        """The resolved `GenerationRequest` of a call (runtime/prepared.py `resolve_request`)."""
        return resolve_request(self, public, max_new_tokens, request, options)

    def prepare(self, prompt: str | Sequence[int], request: GenerationRequest | None = None, *,
                max_new_tokens: int | None = None, compile_constraint: bool = True, **options: Any) -> PreparedRequest:
        """Resolve and check a call once (runtime/prepared.py): the request (`request`, or its fields and the hooks
        as keyword options, as `generate` takes them), the prompt's ids, the context, penalties against the
        vocabulary, the hooks and the constraint (compiled; `compile_constraint=False` leaves it to the run: the
        server compiles after admission). Raises InvalidArgument / TypeError / ConstraintError; runs no model."""
        self._check_open()
        return prepare_call(self, "prepare", prompt, max_new_tokens, request, options, compile_constraint)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int | None = None, *,
                 request: GenerationRequest | None = None, **options: Any) -> GenerationResult:
        """Generate up to `max_new_tokens` tokens (default 128) after `prompt` (text, or a sequence of token ids),
        or run a `PreparedRequest` from `prepare` (then nothing else is given: it holds the whole call).

        The request: `request=GenerationRequest(...)` or its fields as keyword options (runtime/request.py;
        all validated before any backend runs; a bad value raises InvalidArgument):
          temperature (0 = greedy), top_k (0 = off), top_p (1 = off): omitted ones come from the bundle's
                            generation_config.json, else greedy; seed (reproducible sampling)
          method            "draft" | "ngram" | "hybrid" | "medusa" | "head" | "hybrid-head" | "recycle" | "none"
                            (default: auto, every source in one tree: docs/drafting.md; hybrid = n-gram
                            where the context has a match, else the draft model, or the draft head in a bundle
                            without a draft model;
                            hybrid-head = n-gram, else the draft head; recycle = n-gram branches merged with the
                            target's own successor table, Token Recycling: runtime/proposers/recycle.py)
          num_speculative_tokens   k, an int in [0, max_draft_tokens] or "auto" (adaptive; the default)
          ngram_min, ngram_max     n-gram match lengths for methods "ngram" (default 1, 3) and "hybrid" (2, 3)
          stop              stop strings: the text is cut before the first one, the output ends with the token
                            that completed it (finish_reason "stop"; token_ids end with that token)
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
        return collect(*start(self, "generate", prompt, max_new_tokens, request, options), self.tokenizer)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int | None = None, *,
               request: GenerationRequest | None = None, **options: Any) -> Iterator[str]:
        """Yield text pieces as tokens are accepted (incremental detokenization, cut before a stop string);
        arguments as `generate`. A stream left half-read does not block other calls (runtime/exclusive.py)."""
        yield from text_pieces(*start(self, "stream", prompt, max_new_tokens, request, options), self.tokenizer)

    def stream_tokens(self, prompt: str | Sequence[int], max_new_tokens: int | None = None, *,
                      request: GenerationRequest | None = None, **options: Any):
        """Yield (new token ids, stats) per step; the stats object is complete after the last step.
        Arguments as `generate`; with stop strings the last step's ids end with the token that completed one
        (finish_reason "stop"; the text is not cut from them: a caller that wants the cut text runs a `TextStage`)."""
        yield from token_steps(*start(self, "stream_tokens", prompt, max_new_tokens, request, options), self.tokenizer)

    def close(self) -> None:
        """Release the sessions: the batch engines made by `engine()`, then (once a generation in progress has
        ended) the runners, the draft head's and Medusa heads' sessions and the constraint mask thread. Later
        calls raise GeneratorClosed. Safe to call twice."""
        close_models(self)

    def __enter__(self) -> "Generator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise GeneratorClosed("this Generator is closed: load the bundle again (specrt.runtime.load)")

    def encode_prompt(self, prompt: str | Sequence[int]) -> np.ndarray:
        """Token ids [N] of `prompt` (text or ids), checked against the vocabulary and the context length."""
        return prompt_ids(prompt, self.tokenizer, self.bos_id, self.vocab_size, self.max_seq_len)

    def make_policy(self, k: int | str, method: str, seeded: bool = False):
        """The speculation-length policy for `k` (an int or "auto") and `method` (used by the loop and bench).

        `seeded`: the call samples with a seed, so "auto" must not depend on timings (see CountOnlyAdaptiveK in
        policy.py); greedy calls are never `seeded` (their output does not depend on k)."""
        max_k = self.max_draft_tokens
        if method == "auto":  # #51: the proposer sizes the tree; k caps its nodes
            from specrt.runtime.proposers.auto_policy import auto_policy

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
                verify, draft = self._load_costs[:2]
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
        from specrt.runtime.constraint import ConstraintSpec

        if not isinstance(spec, ConstraintSpec):
            raise InvalidArgument(f"constraint must be a ConstraintSpec, got {type(spec).__name__}")
        if self._constraints is None:
            self._constraints = open_constraints(self.manifest, self.vocab_size, self.eos_ids)
        return self._constraints[0].compile(spec)

    def make_proposer(self, method: str, params: SamplingParams, rng: np.random.Generator, options: dict,
                      sources: tuple[str, ...] | None = None):
        """The proposer for `method` bound to this generator's runners (None for method "none"): the one factory,
        runtime/proposers/build.py. `sources`: auto's, resolved (runtime/proposers/auto_sources.py; None: all)."""
        from specrt.runtime.proposers.build import Drafters, build_proposer

        def recycle():
            from specrt.runtime.proposers.recycle import make_recycle

            return make_recycle(self, params, options)

        def medusa():
            from specrt.runtime.proposers.medusa import MedusaProposer

            return MedusaProposer.from_manifest(self.manifest, self._medusa_cache)

        def auto():  # one tree from every source, sized by goodput (runtime/proposers/auto.py)
            from specrt.runtime.proposers.auto import make_auto

            return make_auto(self, params, rng, options, sources)

        m, runner = self.manifest, self.draft
        return build_proposer(method, self.eos_ids, options, Drafters(
            draft=(lambda: DraftModelProposer(runner, params, rng, self.vocab_size)) if runner is not None else None,
            head=(lambda: self._head_proposer(params, rng)) if m.draft_head is not None else None,
            recycle=recycle, medusa=medusa if m.medusa is not None else None, auto=auto))

    def _head_proposer(self, params: SamplingParams, rng: np.random.Generator):
        if self.manifest.draft_head is None:
            raise InvalidArgument("method 'head' needs a bundle compiled with --draft head:DIR (specrt train-head)")
        from specrt.runtime.backends.head import check_fused_head, open_head_runner
        from specrt.runtime.proposers.head import HeadProposer

        check_fused_head(self.manifest, self.target, self.backend)
        if self._head_runner is None:
            self._head_runner = open_head_runner(self.manifest, self.max_seq_len, self.backend, self.target_device)
        return HeadProposer(self._head_runner, params, rng, self.vocab_size)
