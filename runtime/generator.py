"""`load(bundle)` -> `Generator`: the Python API.

    gen = load("artifacts/my-pair")                  # backend="auto" | "ort" | "torch" | "trt"
    res = gen.generate("def fib(n):", max_new_tokens=128, method="draft", num_speculative_tokens=5)
    res.text, res.token_ids, res.stats.acceptance_rate
    for piece in gen.stream("def fib(n):", max_new_tokens=64): print(piece, end="")

Every argument is validated before a backend runs, so a bad call raises `InvalidArgument` and leaves
the generator usable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from specrt.bundle.manifest import Manifest, read_manifest
from specrt.core.errors import GeneratorBusy, InvalidArgument
from specrt.core.tokenizer import IncrementalDecoder, Tokenizer
from specrt.runtime import backends
from specrt.runtime.arguments import check_k, check_options, check_threads, prompt_ids, sampling_params
from specrt.runtime.loop import decode
from specrt.runtime.policy import AdaptiveK, CountOnlyAdaptiveK, FixedK, KPolicy, model_draft_cost
from specrt.runtime.proposers.base import Proposer
from specrt.runtime.proposers.draft_model import DraftModelProposer
from specrt.runtime.proposers.ngram import DEFAULT_MAX_N, DEFAULT_MIN_N, NgramProposer, check_sizes
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.stats import GenerationStats
from specrt.runtime.warmup import warm_up

METHODS = ("draft", "ngram", "hybrid", "medusa", "head", "hybrid-head", "none")
DEFAULT_K = 5
SMALL_DRAFT_PARAMETERS = 50_000_000
STREAM_IDLE_S = 30.0  # seconds an unread stream may hold the Generator before waiters get GeneratorBusy


@dataclasses.dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # the new tokens only
    prompt_token_ids: list[int]
    stats: GenerationStats
    finish_reason: str

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
    verify_checksums  check every file's sha256 (sizes are always checked)
    warmup            run and time every verify shape now (False: on the first call that needs the timings,
                      an adaptive-k speculative call; a one-shot `specrt generate` starts faster)
    Raises BundleError / ChecksumMismatch / VersionMismatch / BackendUnavailable with the fix in the message.
    """
    check_threads(threads)  # before the bundle is read
    manifest = read_manifest(bundle, verify_checksums=verify_checksums)
    return Generator(manifest, backend=backend, threads=threads, target_device=target_device,
                     draft_device=draft_device, warmup=warmup)


class Generator:
    """A loaded bundle: target (and draft) runners, tokenizer and per-method k policies.

    One generation runs at a time per Generator (runners hold KV state); `generate`, `stream` and
    `stream_tokens` share the options documented on `generate`.
    """

    def __init__(self, manifest: Manifest, backend: str = "auto", *, threads: int | None = None,
                 target_device: str | None = None, draft_device: str | None = None, warmup: bool = True) -> None:
        threads = check_threads(threads)
        self.manifest = manifest
        self.backend = backends.resolve_backend(backend, manifest)
        self.max_seq_len = manifest.max_seq_len
        self.max_draft_tokens = manifest.max_draft_tokens
        tok = manifest.tokenizer
        self.tokenizer = Tokenizer(manifest.path(tok.path))
        self.eos_ids = frozenset(int(t) for t in tok.eos_token_ids)
        self.bos_id = tok.bos_token_id
        short = self.max_draft_tokens + 2
        draft_entry = manifest.models.get("draft")
        # A small draft runs fastest on one thread (no pool synchronisation per tiny matmul); a larger one
        # gets a thread pool too, and then the two sessions must not spin against each other.
        small = draft_entry is not None and (draft_entry.num_parameters or 0) < SMALL_DRAFT_PARAMETERS
        draft_threads = 1 if small else threads
        alternating = draft_entry is not None and (draft_threads or backends.default_threads()) > 1
        self.target = backends.create_runner(manifest, "target", self.backend, capacity=self.max_seq_len,
                                             max_short_tokens=short, threads=threads,
                                             want_hidden=manifest.medusa is not None or manifest.draft_head is not None,
                                             device=target_device,
                                             alternating=alternating)
        self.vocab_size = self.target.vocab_size
        self.draft = None
        if draft_entry is not None:
            self.draft = backends.create_runner(manifest, "draft", self.backend, capacity=self.max_seq_len,
                                                max_short_tokens=short, threads=draft_threads,
                                                device=draft_device, alternating=alternating)
        self._medusa_cache: dict = {}  # the heads session, created on first use
        self._head_runner = None  # the draft head's session and cache (draft_head bundles), created on first use
        self._policies: dict = {}  # AdaptiveK per (method, max k), kept across calls
        self._load_costs = None  # (verify seconds per k, draft seconds), from warmup()
        if warmup:
            self.warmup()
        self._lock = threading.Lock()  # one generation at a time per Generator (runners hold state)
        self._owner: int | None = None  # thread id holding the lock (see _exclusive)
        self._suspended_at: float | None = None  # when the holding stream last yielded and was not resumed
        self.stream_idle_s = STREAM_IDLE_S  # how long another thread waits on a stream nobody reads

    def warmup(self) -> None:
        """Run and time every verify shape (see warmup.py): first-use costs stay out of later timings, and
        the adaptive policy starts from the measured costs."""
        self._load_costs = warm_up(self.target, self.draft, self.max_draft_tokens)

    # ----------------------------------------------------------------------------------------- API
    @property
    def methods(self) -> list[str]:
        out = ["none", "ngram"]
        if self.draft is not None:
            out[0:0] = ["draft", "hybrid"]
        if self.manifest.medusa is not None:
            out.append("medusa")
        if self.manifest.draft_head is not None:
            if self.draft is not None:  # hybrid is n-gram + the draft model here; hybrid-head: n-gram + the head
                out += ["head", "hybrid-head"]
            else:  # default: n-gram where the context matches, else the head
                out[0:0] = ["hybrid", "head"]
        return out

    @property
    def default_method(self) -> str:
        return self.methods[0] if self.draft is not None or self.manifest.draft_head is not None else "ngram"

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128, **options: Any) -> GenerationResult:
        """Generate up to `max_new_tokens` tokens after `prompt` (text, or a sequence of token ids).

        Keyword options (all validated before any backend runs; a bad value raises InvalidArgument):
          temperature (0 = greedy), top_k (0 = off), top_p (1 = off), seed (reproducible sampling)
          method            "draft" | "ngram" | "hybrid" | "medusa" | "head" | "hybrid-head" | "none" (default: draft
                            if the bundle has one, else hybrid with a draft head; hybrid = n-gram where the context
                            has a match, else the draft model, or the draft head in a bundle without a draft model;
                            hybrid-head = n-gram, else the draft head)
          num_speculative_tokens   k, an int in [0, max_draft_tokens] or "auto" (adaptive; default 5)
          ngram_min, ngram_max     n-gram match lengths for methods "ngram" (default 1, 3) and "hybrid" (2, 3)
          proposer          a Proposer object to draft with instead of `method`'s (e.g. a custom one)
          policy            a KPolicy object choosing k per step instead of `num_speculative_tokens`
          on_step           callable(k, drafted, accepted) called after every speculative step
        Returns a GenerationResult (text, new token ids, stats, finish_reason "stop" or "length").
        """
        check_options("generate", options)
        ids: list[int] = []
        stats = None
        prompt_ids = None
        for chunk, prompt_ids, stats in self._iterate(prompt, max_new_tokens, **options):
            ids.extend(chunk)
        return GenerationResult(self.tokenizer.decode(ids), ids, prompt_ids, stats, stats.finish_reason)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 128, **options: Any) -> Iterator[str]:
        """Yield text pieces as tokens are accepted (incremental detokenization); options as `generate`."""
        check_options("stream", options)
        dec = IncrementalDecoder(self.tokenizer)
        with contextlib.closing(self._iterate(prompt, max_new_tokens, **options)) as steps:
            for chunk, _, _ in steps:
                piece = dec.push(chunk)
                if piece:
                    yield piece
        tail = dec.flush()
        if tail:
            yield tail

    def stream_tokens(self, prompt: str | Sequence[int], max_new_tokens: int = 128, **options: Any):
        """Yield (new token ids, stats) per step; the stats object is complete after the last step.
        Options as `generate`."""
        check_options("stream_tokens", options)
        with contextlib.closing(self._iterate(prompt, max_new_tokens, **options)) as steps:
            for chunk, _, stats in steps:
                yield chunk, stats

    # ----------------------------------------------------------------------------------- internals
    @contextlib.contextmanager
    def _exclusive(self):
        """One generation at a time. Another thread waits while the holder generates; a stream that is left
        unread for `stream_idle_s` makes waiters fail with GeneratorBusy instead of blocking forever; the
        thread that holds an open stream gets an error instead of a deadlock. Closing or dropping the stream
        releases it."""
        me = threading.get_ident()
        if self._owner == me:
            raise InvalidArgument("this Generator is busy with an unfinished stream() in the same thread: "
                                  "consume it or call its close() first")
        while not self._lock.acquire(timeout=0.05):
            since = self._suspended_at
            if since is not None and time.monotonic() - since > self.stream_idle_s:
                raise GeneratorBusy(f"this Generator is held by a stream() in another thread that has not been read "
                                    f"for {time.monotonic() - since:.0f} s: read it to the end or close() it")
        try:
            self._owner = me
            yield
        finally:
            self._owner = None
            self._suspended_at = None
            self._lock.release()

    def encode_prompt(self, prompt: str | Sequence[int]) -> np.ndarray:
        """Token ids [N] of `prompt` (text or ids), checked against the vocabulary and the context length."""
        return prompt_ids(prompt, self.tokenizer, self.bos_id, self.vocab_size, self.max_seq_len)

    def make_policy(self, k: int | str, method: str, seeded: bool = False):
        """The speculation-length policy for `k` (an int or "auto") and `method` (used by the loop and bench).

        `seeded`: the call samples with a seed, so "auto" must not depend on timings (see CountOnlyAdaptiveK in
        policy.py); greedy calls are never `seeded` (their output does not depend on k)."""
        max_k = self.max_draft_tokens
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
                    self._policies[key].prime(verify, draft if uses_model else 0.0)
            return self._policies[key]
        return FixedK(min(k, max_k))

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
        if method == "ngram":
            return NgramProposer(self.eos_ids, **options)
        if method == "medusa":
            if self.manifest.medusa is None:
                raise InvalidArgument("method 'medusa' needs a bundle compiled with --medusa")
            from specrt.runtime.proposers.medusa import MedusaProposer

            return MedusaProposer.from_manifest(self.manifest, self._medusa_cache)
        raise InvalidArgument(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")

    def _head_proposer(self, params: SamplingParams, rng: np.random.Generator):
        if self.manifest.draft_head is None:
            raise InvalidArgument("method 'head' needs a bundle compiled with --draft head:DIR (specrt train-head)")
        from specrt.runtime.proposers.head import HeadProposer, HeadRunner

        if self._head_runner is None:
            self._head_runner = HeadRunner(self.manifest, self.max_seq_len)
        return HeadProposer(self._head_runner, params, rng, self.vocab_size)

    def _iterate(self, prompt, max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, method: str | None = None,
                 num_speculative_tokens: int | str | None = None, ngram_min: int | None = None,
                 ngram_max: int | None = None, proposer: Proposer | None = None, policy: KPolicy | None = None,
                 on_step: Callable[[int, int, int], None] | None = None, strict: bool = False):
        # Validate everything before touching a runner.
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise InvalidArgument(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        params = sampling_params(temperature, top_k, top_p, seed)
        if proposer is not None:  # a caller's own drafting method: its name goes into the stats
            method = getattr(proposer, "name", "custom")
        if policy is not None and not isinstance(policy, KPolicy):
            raise InvalidArgument(f"policy must implement next_k / current_k / update, got {type(policy).__name__}")
        method = method or self.default_method
        if proposer is None:
            if method not in METHODS:
                raise InvalidArgument(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
            if method == "draft" and self.draft is None or method == "hybrid" and self.draft is None and \
                    self.manifest.draft_head is None:
                raise InvalidArgument(f"method {method!r} needs a bundle compiled with --draft")
            if method in ("head", "hybrid-head") and self.manifest.draft_head is None:
                raise InvalidArgument(f"method {method!r} needs a bundle compiled with --draft head:DIR "
                                      "(specrt train-head)")
            if method == "medusa" and self.manifest.medusa is None:
                raise InvalidArgument("method 'medusa' needs a bundle compiled with --medusa")
        if num_speculative_tokens is None:
            num_speculative_tokens = min(DEFAULT_K, self.max_draft_tokens)
        k = check_k(num_speculative_tokens, self.max_draft_tokens)
        prompt_ids = self.encode_prompt(prompt)
        room = self.max_seq_len - int(prompt_ids.size)
        if strict and max_new_tokens > room:
            raise InvalidArgument(
                f"prompt has {prompt_ids.size} tokens: with max_new_tokens={max_new_tokens} it exceeds the "
                f"bundle's context of {self.max_seq_len} tokens (at most {room} new tokens fit)")
        options = {key: v for key, v in (("min_n", ngram_min), ("max_n", ngram_max)) if v is not None}
        if options:
            check_sizes(options.get("min_n", DEFAULT_MIN_N), options.get("max_n", DEFAULT_MAX_N))
        return self._run(prompt_ids, max_new_tokens, params, method, k, options, proposer, policy, on_step,
                         max_new_tokens > room)

    def _run(self, prompt_ids, max_new_tokens, params, method, k, options, proposer, policy, on_step,
             context_limited=False):
        rng = params.rng()
        with self._exclusive():
            if proposer is None and max_new_tokens > 1:  # one token comes from the prefill: nothing to draft
                proposer = self.make_proposer(method, params, rng, options)
            if proposer is not None and policy is None:
                policy = self.make_policy(k, method, params.seed is not None and not params.greedy)
            stats = GenerationStats(method=method, backend=self.backend, prompt_tokens=int(prompt_ids.size),
                                    provider=self.target.describe().get("provider", self.backend),
                                    context_limited=context_limited)
            started = time.perf_counter()
            explains = policy is not None and hasattr(policy, "off_reason")
            noted_off = False  # whether speculation_note describes speculation as off
            for chunk in decode(self.target, proposer, policy, prompt_ids, max_new_tokens=max_new_tokens,
                                max_draft_tokens=self.max_draft_tokens, params=params, rng=rng,
                                eos_ids=self.eos_ids, stats=stats, on_step=on_step):
                stats.elapsed_s = time.perf_counter() - started
                # why speculation is off, built when it turns off (not every step), cleared when it turns back
                # on: a caller that reads the stats mid-stream or stops early sees the current state
                if explains and (stats.num_speculative_tokens == 0) != noted_off:
                    noted_off = not noted_off
                    stats.speculation_note = policy.off_reason() if noted_off else ""
                self._suspended_at = time.monotonic()
                yield chunk, prompt_ids.tolist(), stats
                self._suspended_at = None
            if noted_off:  # the reason with the final estimates
                stats.speculation_note = policy.off_reason()
