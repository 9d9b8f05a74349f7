"""`GenerationRequest`: the one typed request every front end builds (Python API, CLI, server, bench, scheduler).

    req = GenerationRequest(max_new_tokens=64, method="ngram", num_speculative_tokens="auto", temperature=0.7)
    gen.generate("def fib(n):", request=req)          # or the same fields as keyword options

One default and one validation per field, here:
* `num_speculative_tokens` (k): "auto" (adaptive, the default everywhere) or an int >= 0; strings such as "4"
  are parsed here (`parse_k`) and nowhere else. The bundle's compiled maximum is checked by `check_for`.
* sampling: `temperature`, `top_k`, `top_p` left as None mean "not given": `with_defaults` fills them from the
  bundle's `generation_config.json` (what vLLM does), else from the front end's fallback (greedy for the Python
  API and the CLI, temperature 1 for the OpenAI-compatible server). `sampling` is the warping part
  (`runtime.sampling.SamplingParams`, shared by draft and target), built only from a resolved request.
* penalties (presence / frequency / repetition), logit_bias and logprobs: `logits_params`
  (runtime/logits_processors.py), applied to the target's rows by the decode loop.
* stop strings, max_new_tokens, strict (refuse instead of stopping at the context), n-gram sizes, seed.
* `auto_sources`: which sources method auto drafts from (runtime/proposers/auto_sources.py); names checked here,
  availability in the bundle by `Generator.request`, which resolves it to the explicit list of sources.

Adding a field (a structured-output constraint, a new method's option): one dataclass field with its default,
one `_check_*` line in `__post_init__`; `from_options` and the front ends pick it up by name.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.runtime.logits_processors import LogitsParams
from specrt.runtime.proposers.auto_sources import check_method, parse_sources
from specrt.runtime.proposers.ngram import DEFAULT_MAX_N, DEFAULT_MIN_N, check_sizes
from specrt.runtime.sampling import SamplingParams

METHODS = ("auto", "draft", "ngram", "hybrid", "medusa", "head", "hybrid-head", "recycle", "none")
DEFAULT_K: int | str = "auto"
DEFAULT_MAX_NEW_TOKENS = 128
MAX_STOP_STRINGS = 16
MAX_STOP_TOKEN_IDS = 64
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")  # read from generation_config.json when a request omits them
MAX_CHOICES = 16  # choices of one request (n, times the prompts of a /v1/completions batch)
SEED_RANGE = 2**63


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a request with n > 1: (seed + index) mod 2**63, as vLLM derives its n child
    requests' seeds; no seed stays None (every choice draws fresh entropy)."""
    return None if seed is None else (int(seed) + int(index)) % SEED_RANGE


class RequestFieldError(InvalidArgument):
    """A request field is invalid; `field` names it (the server reports it as the error's `param`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_k(k: Any) -> int | str:
    """num_speculative_tokens: "auto" or an integer >= 0 (an int, or a string of one). The only parser of k."""
    if k == "auto":
        return "auto"
    if isinstance(k, str):
        try:
            k = int(k)
        except ValueError:
            raise RequestFieldError("num_speculative_tokens",
                                    f"num_speculative_tokens must be an integer or 'auto', got {k!r}") from None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise RequestFieldError("num_speculative_tokens", f"num_speculative_tokens must be an integer or 'auto', got {k!r}")
    if k < 0:
        raise RequestFieldError("num_speculative_tokens", f"num_speculative_tokens must be >= 0 or 'auto', got {k}")
    return int(k)


def _is_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    method: str | None = None  # None: the bundle's default, auto (runtime/proposers/auto.py)
    num_speculative_tokens: int | str = DEFAULT_K  # k per step, or "auto"
    temperature: float | None = None  # None: generation_config, else the front end's fallback; 0 = greedy
    top_k: int | None = None  # 0 = off
    top_p: float | None = None  # 1 = off
    min_p: float | None = None  # 0 = off (vLLM / transformers / llama.cpp): tokens below min_p x the likeliest dropped
    seed: int | None = None
    ngram_min: int | None = None  # n-gram match lengths (methods ngram, hybrid, recycle); None = the method's default
    ngram_max: int | None = None
    stop: tuple[str, ...] = ()  # stop strings (the text is cut before the first one)
    strict: bool = False  # refuse a prompt + max_new_tokens beyond the context instead of stopping at it
    constraint: Any = None  # a ConstraintSpec (runtime/constraint.py): JSON schema, json_object, regex, grammar
    forced_tokens: bool = True  # with a constraint and a drafting method: verify forced tokens with the drafts
    presence_penalty: float = 0.0  # [-2, 2] (OpenAI; generated tokens)
    frequency_penalty: float = 0.0  # [-2, 2] (OpenAI; generated tokens)
    repetition_penalty: float = 1.0  # (0, 2] (vLLM / transformers; prompt + generated); 1 = off
    logit_bias: Any = ()  # {token id: bias in [-100, 100]}; -100 bans; stored as sorted ((id, bias), ...)
    logprobs: int | None = None  # None = off; N in [0, 20]: each token's logprob and its top N alternatives
    auto_sources: Any = None  # method auto's sources ("ngram,recycle", "-head"; proposers/auto_sources.py); None = all
    stop_token_ids: Any = ()  # token ids that end the generation as EOS does (vLLM); kept in token_ids, as EOS is
    ignore_eos: bool = False  # the model's EOS ids do not end the generation (vLLM: benchmarks of fixed lengths)

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise RequestFieldError("max_new_tokens", f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.method is not None and self.method not in METHODS:
            raise RequestFieldError("method", f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        object.__setattr__(self, "num_speculative_tokens", parse_k(self.num_speculative_tokens))
        object.__setattr__(self, "stop", self._check_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", self._check_stop_ids(self.stop_token_ids))
        if not isinstance(self.ignore_eos, bool):
            raise RequestFieldError("ignore_eos", f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        try:
            object.__setattr__(self, "auto_sources", parse_sources(self.auto_sources))
            check_method(self.auto_sources, self.method)
        except InvalidArgument as exc:
            raise RequestFieldError("auto_sources", str(exc)) from None
        if self.ngram_min is not None or self.ngram_max is not None:
            check_sizes(DEFAULT_MIN_N if self.ngram_min is None else self.ngram_min,
                        DEFAULT_MAX_N if self.ngram_max is None else self.ngram_max)
        if not isinstance(self.strict, bool):
            raise RequestFieldError("strict", f"strict must be True or False, got {self.strict!r}")
        if not isinstance(self.forced_tokens, bool):
            raise RequestFieldError("forced_tokens", f"forced_tokens must be True or False, got {self.forced_tokens!r}")
        if self.constraint is not None:
            from specrt.runtime.constraint import ConstraintSpec

            if not isinstance(self.constraint, ConstraintSpec):
                raise RequestFieldError("constraint", f"constraint must be a ConstraintSpec, got "
                                                      f"{type(self.constraint).__name__}")
            if self.ignore_eos or self.stop_token_ids:
                field = "ignore_eos" if self.ignore_eos else "stop_token_ids"
                raise RequestFieldError(field, f"{field} cannot be combined with structured output (the constraint "
                                               "ends the output with the model's EOS)")
        try:  # penalties, bias and logprobs: one validation, LogitsParams'
            object.__setattr__(self, "logit_bias", self.logits_params.logit_bias)
        except InvalidArgument as exc:
            raise RequestFieldError(getattr(exc, "field", "logit_bias"), str(exc)) from None
        for name in ("temperature", "top_p", "min_p"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer))):
                raise RequestFieldError(name, f"{name} must be a number, got {v!r}")
        if self.top_k is not None and not _is_int(self.top_k):
            raise RequestFieldError("top_k", f"top_k must be an integer, got {self.top_k!r}")
        try:  # ranges of the sampling fields (and the seed): one validation, SamplingParams'
            self._sampling(0.0)
        except InvalidArgument as exc:
            raise RequestFieldError(str(exc).split(" ", 1)[0], str(exc)) from None

    @staticmethod
    def _check_stop(stop: Any) -> tuple[str, ...]:
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if any(not isinstance(s, str) or s == "" for s in stops):
            raise RequestFieldError("stop", "stop strings must be non-empty strings")
        if len(stops) > MAX_STOP_STRINGS:
            raise RequestFieldError("stop", f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(stops)}")
        return stops

    @staticmethod
    def _check_stop_ids(ids: Any) -> tuple[int, ...]:
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
            raise RequestFieldError("stop_token_ids", f"stop_token_ids must be a list of token ids, got {ids!r}")
        if any(not _is_int(t) or t < 0 for t in ids):
            raise RequestFieldError("stop_token_ids", "stop_token_ids must be token ids (integers >= 0)")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise RequestFieldError("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are supported, "
                                                      f"got {len(ids)}")
        return tuple(int(t) for t in ids)

    def stop_ids(self, eos_ids: frozenset[int]) -> frozenset[int]:
        """The tokens that end this request's generation: the model's EOS ids (none with ignore_eos) and
        stop_token_ids."""
        return (frozenset() if self.ignore_eos else frozenset(eos_ids)) | frozenset(self.stop_token_ids)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_options(cls, public: str = "generate", **options: Any) -> "GenerationRequest":
        """Build from keyword options; a misspelled one names the public method and lists the options."""
        names = cls.fields()
        for name in options:
            if name not in names:
                raise TypeError(f"{public}() got an unexpected keyword argument {name!r}; options: {', '.join(names)}")
        return cls(**{k: v for k, v in options.items() if v is not None or k in ("seed",)})

    def replace(self, **changes: Any) -> "GenerationRequest":
        return dataclasses.replace(self, **changes)

    def for_choice(self, index: int) -> "GenerationRequest":
        """This request as choice `index` of n (seed from `choice_seed`; choice 0 is the request itself)."""
        if not _is_int(index) or index < 0:
            raise RequestFieldError("n", f"a choice index must be an integer >= 0, got {index!r}")
        return self if index == 0 or self.seed is None else self.replace(seed=choice_seed(self.seed, index))

    def with_defaults(self, defaults: Mapping[str, Any], fallback_temperature: float = 0.0) -> "GenerationRequest":
        """Fill omitted sampling fields: the bundle's generation_config values (`defaults`), else
        temperature `fallback_temperature`, top_k 0, top_p 1, min_p 0."""
        fill = {"temperature": fallback_temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
        changes = {k: defaults.get(k, fill[k]) for k in SAMPLING_KEYS if getattr(self, k) is None}
        return self.replace(**changes) if changes else self

    def _sampling(self, fallback_temperature: float) -> SamplingParams:
        t = fallback_temperature if self.temperature is None else float(self.temperature)
        return SamplingParams(temperature=t, top_k=0 if self.top_k is None else int(self.top_k),
                              top_p=1.0 if self.top_p is None else float(self.top_p), seed=self.seed,
                              min_p=0.0 if self.min_p is None else float(self.min_p))

    @property
    def sampling(self) -> SamplingParams:
        """The warping parameters (temperature / top-k / top-p / seed); omitted ones as greedy / off."""
        return self._sampling(0.0)

    @property
    def logits_params(self) -> LogitsParams:
        """Penalties, logit_bias and logprobs (runtime/logits_processors.py)."""
        return LogitsParams(self.presence_penalty, self.frequency_penalty, self.repetition_penalty,
                            self.logit_bias, self.logprobs)

    @property
    def ngram_sizes(self) -> dict[str, int]:
        """{"min_n", "max_n"} given by the request (the proposer's defaults for the others)."""
        return {key: v for key, v in (("min_n", self.ngram_min), ("max_n", self.ngram_max)) if v is not None}

    def check_for(self, max_draft_tokens: int, methods: list[str] | None = None,
                  vocab_size: int | None = None) -> None:
        """Checks that need the bundle: k within its compiled maximum, the method available in it, stop_token_ids
        within its vocabulary."""
        outside = [t for t in self.stop_token_ids if vocab_size is not None and t >= vocab_size]
        if outside:
            raise RequestFieldError("stop_token_ids", f"stop_token_ids holds {outside[0]}, outside the "
                                                      f"{vocab_size}-token vocabulary")
        k = self.num_speculative_tokens
        if k != "auto" and k > max_draft_tokens:
            raise RequestFieldError("num_speculative_tokens",
                                    f"num_speculative_tokens={k} is outside [0, {max_draft_tokens}] "
                                    f"(the bundle was compiled with --max-draft-tokens {max_draft_tokens})")
        if methods is not None and self.method is not None and self.method not in methods:
            needs = {"draft": "--draft", "hybrid": "--draft", "medusa": "--medusa", "head": "--draft head:DIR",
                     "hybrid-head": "--draft head:DIR"}.get(self.method)
            why = f"needs a bundle compiled with {needs}: it is" if needs else "is"
            raise RequestFieldError("method", f"method {self.method!r} {why} not available with this bundle; "
                                              f"choose one of {', '.join(methods)}")


def generation_defaults(bundle_root: Path, role_dir: str = "target") -> dict[str, Any]:
    """temperature / top_k / top_p from `<bundle>/target/generation_config.json` when the checkpoint had one
    (vLLM's rule: the model's generation config supplies the defaults a request omits). Invalid values are
    ignored (a request can always set its own)."""
    path = Path(bundle_root) / role_dir / "generation_config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for key in SAMPLING_KEYS:
        v = data.get(key) if isinstance(data, dict) else None
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        try:
            GenerationRequest(**{key: v})
        except InvalidArgument:
            continue
        out[key] = v
    return out
