"""`PreparedRequest`: one call resolved and checked once, against one bundle, before any runner runs.

    p = gen.prepare("def fib(n):", max_new_tokens=64, method="ngram")   # every check, once
    gen.generate(p)            # or gen.stream(p) / gen.stream_tokens(p) / engine.stream_tokens(p)
    engine.generate_batch([p1, p2])

`Generator.prepare` (runtime/generator.py) is the one place a call is resolved: the typed request (sampling defaults
filled, k within the compiled maximum, the method available in the bundle), the prompt's token ids (text encoded
once; non-empty, in the vocabulary, shorter than the context), the context room (`strict` refuses, else the call
stops at the context), penalties and logit_bias against the vocabulary, the hooks (proposer / policy / on_step) and
the constraint, compiled. Everything downstream (the decode loop, the batch engine, the scheduler, the server's
workers) reads this object and never resolves again.

A prepared request is for one bundle (any Generator that loaded it: the server prepares on its first slot and runs on
another). A compiled constraint is one run's parser state: the first run takes it, a later run of the same object
(or a choice made by `for_choice`) compiles a fresh copy from the compiler's cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.runtime.logits_processors import LogitsParams
from specrt.runtime.policy import KPolicy
from specrt.runtime.request import GenerationRequest, RequestFieldError

HOOKS = ("proposer", "policy", "on_step")  # call options that are objects, not request fields


class ContextExceeded(RequestFieldError):
    """A strict request's prompt + max_new_tokens pass the bundle's context (the numbers are attributes: the server
    words its OpenAI error from them)."""

    def __init__(self, prompt_tokens: int, max_new_tokens: int, context: int) -> None:
        room = context - prompt_tokens
        super().__init__("max_new_tokens",
                         f"prompt has {prompt_tokens} tokens: with max_new_tokens={max_new_tokens} it exceeds the "
                         f"bundle's context of {context} tokens (at most {room} new tokens fit)")
        self.prompt_tokens, self.max_new_tokens, self.context = prompt_tokens, max_new_tokens, context


def context_room(prompt_tokens: int, request: GenerationRequest, context: int) -> bool:
    """The one context check: whether prompt + max_new_tokens pass `context` (the generation then stops at it);
    a strict request raises ContextExceeded instead."""
    limited = request.max_new_tokens > context - prompt_tokens
    if limited and request.strict:
        raise ContextExceeded(prompt_tokens, request.max_new_tokens, context)
    return limited


def check_hooks(hooks: dict[str, Any]) -> None:
    """proposer: an object with `propose`; policy: a KPolicy; on_step: a callable."""
    policy, proposer, on_step = hooks.get("policy"), hooks.get("proposer"), hooks.get("on_step")
    if policy is not None and not isinstance(policy, KPolicy):
        raise InvalidArgument(f"policy must implement next_k / current_k / update, got {type(policy).__name__}")
    if proposer is not None and not callable(getattr(proposer, "propose", None)):
        raise InvalidArgument(f"proposer must implement start / propose / observe, got {type(proposer).__name__}")
    if on_step is not None and not callable(on_step):
        raise InvalidArgument(f"on_step must be callable(k, drafted, accepted), got {type(on_step).__name__}")


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedRequest:
    prompt_ids: np.ndarray  # [N] int64: non-empty, in the vocabulary, N < the context
    request: GenerationRequest  # resolved: sampling defaults filled, checked against the bundle (k, method)
    method: str  # the method that runs: request.method, the bundle's default, or a custom proposer's name
    context_limited: bool  # prompt + max_new_tokens pass the context: the generation stops there
    proposer: Any = None  # hooks (Generator.generate): a Proposer, a KPolicy, callable(k, drafted, accepted)
    policy: Any = None
    on_step: Callable[[int, int, int], None] | None = None
    # the compiled constraint (a one-run parser state), taken by the first run: `take_constraint`
    _constraint: list = dataclasses.field(default_factory=list, repr=False)

    @property
    def max_new_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def stop(self) -> tuple[str, ...]:
        return self.request.stop

    @property
    def logits(self) -> LogitsParams | None:
        """Penalties / logit_bias / logprobs when the request has any (checked against the vocabulary), else None."""
        params = self.request.logits_params
        return params if params.active else None

    def take_constraint(self) -> Any:
        """The compiled constraint for one run (None when it is still to be compiled, or there is none)."""
        return self._constraint.pop() if self._constraint else None

    def without_stop(self) -> "PreparedRequest":
        """The same call with no stop strings (a caller that watches them on its own text: the server's worker)."""
        return self if not self.request.stop else self._copy(request=self.request.replace(stop=()))

    def for_choice(self, index: int) -> "PreparedRequest":
        """Choice `index` of n (`GenerationRequest.for_choice`: its seed); nothing is checked again. Its constraint,
        if any, is compiled by its run (each choice has its own parser state)."""
        return self if index == 0 else self._copy(request=self.request.for_choice(index))

    def _copy(self, **changes: Any) -> "PreparedRequest":
        return dataclasses.replace(self, _constraint=[], **changes)


def resolve_request(gen, public: str, max_new_tokens: int | None, request: GenerationRequest | None,
                    options: dict) -> GenerationRequest:
    """`Generator.request`: `request` or the keyword options (not both), with `max_new_tokens` when given, omitted
    sampling fields from the bundle's generation_config (else greedy), checked against the bundle (k, method)."""
    if request is None:
        request = GenerationRequest.from_options(f"Generator.{public}", **options)
    elif not isinstance(request, GenerationRequest):
        raise InvalidArgument(f"request must be a GenerationRequest, got {type(request).__name__}")
    elif options:
        raise TypeError(f"Generator.{public}() takes either request= or keyword options, not both "
                        f"(got {', '.join(options)})")
    if max_new_tokens is not None:
        request = request.replace(max_new_tokens=max_new_tokens)
    request = request.with_defaults(gen.sampling_defaults)
    request.check_for(gen.max_draft_tokens, gen.methods, gen.vocab_size)
    if request.auto_sources is not None:  # explicit from here on (proposers/auto_sources.py)
        from specrt.runtime.proposers.auto_sources import available, resolve

        try:
            request = request.replace(auto_sources=resolve(request.auto_sources, available(gen)))
        except InvalidArgument as exc:  # naming the field (the server's `param`)
            raise RequestFieldError("auto_sources", str(exc)) from None
    return request


def prepare_call(gen, public: str, prompt: Any, max_new_tokens: int | None, request: GenerationRequest | None,
                 options: dict, compile_constraint: bool = True) -> PreparedRequest:
    """`Generator.prepare`: every check of a call, once: the request (`resolve_request`), then `prepare_prompt`."""
    hooks = {name: options.pop(name) for name in HOOKS if name in options}
    request = gen.request(public, max_new_tokens, request, **options)
    return prepare_prompt(gen, prompt, request, hooks, compile_constraint)


def prepare_prompt(gen, prompt: Any, request: GenerationRequest, hooks: dict | None = None,
                   compile_constraint: bool = True) -> PreparedRequest:
    """`prompt` with a request `Generator.request` resolved (one request for several prompts is resolved once):
    the hooks, the prompt's ids, the context, penalties against the vocabulary, the constraint (compiled)."""
    hooks = hooks or {}
    check_hooks(hooks)
    proposer = hooks.get("proposer")
    method = getattr(proposer, "name", "custom") if proposer is not None else (request.method or gen.default_method)
    try:
        ids = gen.encode_prompt(prompt)
    except RequestFieldError:
        raise
    except InvalidArgument as exc:  # the same message, naming the field (the server's `param`)
        raise RequestFieldError("prompt", str(exc)) from None
    limited = context_room(int(ids.size), request, gen.max_seq_len)
    if request.logits_params.active:
        request.logits_params.check_vocab(gen.vocab_size)
    prepared = PreparedRequest(ids, request, method, limited, proposer, hooks.get("policy"), hooks.get("on_step"))
    if compile_constraint and request.constraint is not None:
        prepared._constraint.append(gen.compile_constraint(request.constraint))
    return prepared
