"""`load(bundle)` -> `Generator`: the Python API.

    gen = load("artifacts/my-pair")                  # backend="auto" | "ort" | "torch" | "trt"
    res = gen.generate("def fib(n):", max_new_tokens=128, method="draft", num_speculative_tokens=5)
    res.text, res.token_ids, res.stats.acceptance_rate
    for piece in gen.stream("def fib(n):", max_new_tokens=64): print(piece, end="")

Every argument is validated before a backend runs, so a bad call raises `InvalidArgument` and leaves
the generator usable.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..bundle.manifest import Manifest, read_manifest
from ..core.errors import InvalidArgument
from . import backends
from .policy import FixedK
from .loop import decode
from .proposers.draft_model import DraftModelProposer
from .sampling import SamplingParams
from .stats import GenerationStats
from ..core.tokenizer import IncrementalDecoder, Tokenizer

METHODS = ("draft", "ngram", "medusa", "none")
DEFAULT_K = 5
SMALL_DRAFT_PARAMETERS = 50_000_000


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
         verify_checksums: bool = True) -> "Generator":
    """Validate the bundle's manifest and checksums, then create the runners."""
    manifest = read_manifest(bundle, verify_checksums=verify_checksums)
    return Generator(manifest, backend=backend, threads=threads, target_device=target_device,
                     draft_device=draft_device)


class Generator:
    def __init__(self, manifest: Manifest, backend: str = "auto", *, threads: int | None = None,
                 target_device: str | None = None, draft_device: str | None = None) -> None:
        self.manifest = manifest
        self.backend = backends.resolve_backend(backend, manifest)
        self.max_seq_len = manifest.max_seq_len
        self.max_draft_tokens = manifest.max_draft_tokens
        tok = manifest["tokenizer"]
        self.tokenizer = Tokenizer(manifest.path(tok["path"]))
        self.eos_ids = frozenset(int(t) for t in tok.get("eos_token_ids") or [])
        self.bos_id = tok.get("bos_token_id")
        short = self.max_draft_tokens + 2
        self.target = backends.create_runner(manifest, "target", self.backend, capacity=self.max_seq_len,
                                             max_short_tokens=short, threads=threads,
                                             want_hidden="medusa" in manifest.data, device=target_device)
        self.vocab_size = self.target.vocab_size
        self.draft = None
        if "draft" in manifest.models:
            # A small draft runs fastest on one thread (no pool synchronisation per tiny matmul).
            small = manifest.models["draft"].get("num_parameters", 0) < SMALL_DRAFT_PARAMETERS
            self.draft = backends.create_runner(manifest, "draft", self.backend, capacity=self.max_seq_len,
                                                max_short_tokens=short, threads=1 if small else threads,
                                                device=draft_device)
        self._medusa_cache: dict = {}  # the heads session, created on first use
        self._controllers: dict = {}  # AdaptiveK per (method, max k), kept across calls
        self.warmup()
        self._lock = threading.Lock()  # one generation at a time per Generator (runners hold state)

    def warmup(self) -> None:
        """Run every verify shape once so first-use costs (allocations) stay out of timings and of the
        adaptive controller's cost estimates."""
        ids = np.zeros(self.max_draft_tokens + 1, dtype=np.int64)
        for runner, sizes in ((self.target, range(1, self.max_draft_tokens + 2)), (self.draft, (1, 2))):
            if runner is None:
                continue
            for s in sizes:
                runner.reset()
                runner.forward(ids[:s])
            runner.reset()
        self._load_costs = measure_costs(self.target, self.draft, self.max_draft_tokens)

    # ----------------------------------------------------------------------------------------- API
    @property
    def methods(self) -> list[str]:
        out = ["none", "ngram"]
        if self.draft is not None:
            out.insert(0, "draft")
        if "medusa" in self.manifest.data:
            out.append("medusa")
        return out

    @property
    def default_method(self) -> str:
        return self.methods[0] if self.draft is not None else "ngram"

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128, **kwargs: Any) -> GenerationResult:
        ids: list[int] = []
        stats = None
        prompt_ids = None
        for chunk, prompt_ids, stats in self._iterate(prompt, max_new_tokens, **kwargs):
            ids.extend(chunk)
        return GenerationResult(self.tokenizer.decode(ids), ids, prompt_ids, stats, stats.finish_reason)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 128, **kwargs: Any) -> Iterator[str]:
        """Yield text pieces as tokens are accepted (incremental detokenization)."""
        dec = IncrementalDecoder(self.tokenizer)
        for chunk, _, _ in self._iterate(prompt, max_new_tokens, **kwargs):
            piece = dec.push(chunk)
            if piece:
                yield piece
        tail = dec.flush()
        if tail:
            yield tail

    def stream_tokens(self, prompt, max_new_tokens: int = 128, **kwargs: Any):
        """Yield (new token ids, stats) per step; the stats object is complete after the last step."""
        for chunk, _, stats in self._iterate(prompt, max_new_tokens, **kwargs):
            yield chunk, stats

    # ----------------------------------------------------------------------------------- internals
    def encode_prompt(self, prompt: str | Sequence[int]) -> np.ndarray:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            if self.bos_id is None:
                raise InvalidArgument("empty prompt, and the model has no BOS token to start from")
            ids = [int(self.bos_id)]
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidArgument(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.max_seq_len:
            raise InvalidArgument(
                f"prompt has {len(ids)} tokens; the bundle was compiled for max_seq_len={self.max_seq_len}, "
                f"which leaves room for prompts of at most {self.max_seq_len - 1} tokens "
                "(recompile with a larger --max-seq-len)"
            )
        return np.asarray(ids, dtype=np.int64)

    def _check_k(self, k: int | str) -> int | str:
        if k == "auto":
            return k
        if isinstance(k, str):
            try:
                k = int(k)
            except ValueError:
                raise InvalidArgument(f"num_speculative_tokens must be an integer or 'auto', got {k!r}") from None
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise InvalidArgument(f"num_speculative_tokens must be an integer or 'auto', got {k!r}")
        if not 0 <= k <= self.max_draft_tokens:
            raise InvalidArgument(
                f"num_speculative_tokens={k} is outside [0, {self.max_draft_tokens}] "
                f"(the bundle was compiled with --max-draft-tokens {self.max_draft_tokens})"
            )
        return int(k)

    def make_policy(self, k: int | str, method: str):
        """The speculation-length policy for `k` (an int or "auto") and `method` (used by the loop and bench)."""
        max_k = self.max_draft_tokens
        if method == "medusa":  # one draft per head
            max_k = min(max_k, int(self.manifest["medusa"]["num_heads"]))
        if k == "auto":
            from .policy import AdaptiveK

            key = (method, max_k)
            if key not in self._controllers:  # kept across calls: costs and acceptance carry over
                self._controllers[key] = AdaptiveK(max_k)
                verify, draft = self._load_costs
                if method != "medusa":  # start short runs at the k the load-time costs predict best
                    self._controllers[key].prime(verify, draft if method == "draft" else 0.0)
            return self._controllers[key]
        return FixedK(min(k, max_k))

    def make_proposer(self, method: str, params: SamplingParams, rng: np.random.Generator, options: dict):
        """The proposer for `method` bound to this generator's runners (None for method "none")."""
        if method == "none":
            return None
        if method == "draft":
            if self.draft is None:
                raise InvalidArgument("method 'draft' needs a bundle compiled with --draft")
            return DraftModelProposer(self.draft, params, rng, self.vocab_size)
        if method == "ngram":
            from .proposers.ngram import NgramProposer

            return NgramProposer(self.eos_ids, **options)
        if method == "medusa":
            if "medusa" not in self.manifest.data:
                raise InvalidArgument("method 'medusa' needs a bundle compiled with --medusa")
            from .proposers.medusa import MedusaProposer

            return MedusaProposer.from_manifest(self.manifest, self.target, params, rng, self._medusa_cache)
        raise InvalidArgument(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")

    def _iterate(self, prompt, max_new_tokens: int, *, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, method: str | None = None,
                 num_speculative_tokens: int | str | None = None, ngram_min: int | None = None,
                 ngram_max: int | None = None, strict: bool = False):
        # Validate everything before touching a runner.
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise InvalidArgument(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        params = SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), seed=seed)
        method = method or self.default_method
        if method not in METHODS:
            raise InvalidArgument(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if method == "draft" and self.draft is None:
            raise InvalidArgument("method 'draft' needs a bundle compiled with --draft")
        if method == "medusa" and "medusa" not in self.manifest.data:
            raise InvalidArgument("method 'medusa' needs a bundle compiled with --medusa")
        if num_speculative_tokens is None:
            num_speculative_tokens = min(DEFAULT_K, self.max_draft_tokens)
        k = self._check_k(num_speculative_tokens)
        prompt_ids = self.encode_prompt(prompt)
        room = self.max_seq_len - int(prompt_ids.size)
        if strict and max_new_tokens > room:
            raise InvalidArgument(
                f"prompt has {prompt_ids.size} tokens: with max_new_tokens={max_new_tokens} it exceeds the "
                f"bundle's context of {self.max_seq_len} tokens (at most {room} new tokens fit)")
        options = {key: v for key, v in (("min_n", ngram_min), ("max_n", ngram_max)) if v is not None}
        return self._run(prompt_ids, max_new_tokens, params, method, k, options, max_new_tokens > room)

    def _run(self, prompt_ids, max_new_tokens, params, method, k, options, context_limited=False):
        rng = params.rng()
        with self._lock:
            proposer = self.make_proposer(method, params, rng, options)
            policy = self.make_policy(k, method) if proposer is not None else None
            stats = GenerationStats(method=method, backend=self.backend, prompt_tokens=int(prompt_ids.size),
                                    provider=self.target.describe().get("provider", self.backend),
                                    context_limited=context_limited)
            started = time.perf_counter()
            for chunk in decode(self.target, proposer, policy, prompt_ids, max_new_tokens=max_new_tokens,
                                max_draft_tokens=self.max_draft_tokens, params=params, rng=rng,
                                eos_ids=self.eos_ids, stats=stats):
                stats.elapsed_s = time.perf_counter() - started
                if policy is not None and hasattr(policy, "off_reason"):
                    stats.speculation_note = policy.off_reason() if stats.num_speculative_tokens == 0 else ""
                yield chunk, prompt_ids.tolist(), stats


def measure_costs(target, draft, max_k: int) -> tuple[list[float], float | None]:
    """Seconds of one target pass over k + 1 tokens (k = 0..max_k) and of one draft token, measured at
    load after the warm-up (best of two): the adaptive controller's starting point."""
    ids = np.zeros(max_k + 1, dtype=np.int64)

    def timed(runner, s: int) -> float:
        best = float("inf")
        for _ in range(2):
            runner.reset()
            t0 = time.perf_counter()
            runner.forward(ids[:s])
            best = min(best, time.perf_counter() - t0)
        runner.reset()
        return best

    verify = [timed(target, k + 1) for k in range(max_k + 1)]
    return verify, (timed(draft, 1) if draft is not None else None)
