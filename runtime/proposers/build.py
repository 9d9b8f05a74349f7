"""The one proposer factory: a drafting method's name -> its proposer, for the Generator (one request at a time) and
the batching scheduler (a proposer per request, on its draft region).

The model-backed parts are made by the caller's `Drafters` (each a callable, None where the bundle has none): the
Generator binds them to its runners, the scheduler to a request's draft region (a lazy draft model). The rest (the
n-gram tables, hybrid's composition, the errors for a method the bundle cannot run) is here once.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from specrt.core.errors import InvalidArgument
from specrt.runtime.proposers.base import Proposer
from specrt.runtime.proposers.hybrid import DEFAULT_MAX_N, DEFAULT_MIN_N, HybridProposer
from specrt.runtime.proposers.ngram import NgramProposer
from specrt.runtime.request import METHODS

HEAD_MISSING = "method 'head' needs a bundle compiled with --draft head:DIR (specrt train-head)"


@dataclasses.dataclass(frozen=True)
class Drafters:
    """Makers of the model-backed proposers (called once per proposer built); None: the bundle has none."""

    draft: Callable[[], Proposer] | None = None  # a draft model's (DraftModelProposer)
    head: Callable[[], Proposer] | None = None  # a draft head's (HeadProposer)
    recycle: Callable[[], Proposer] | None = None  # Token Recycling's (the bundle's successor table)
    medusa: Callable[[], Proposer] | None = None  # Medusa heads'
    auto: Callable[[], Proposer] | None = None  # every source in one tree (auto.py); None: n-gram chains


def hybrid(eos_ids: frozenset[int], draft: Proposer, ngram_sizes: dict) -> HybridProposer:
    """Prompt lookup where the context has a match (hybrid's sizes unless the request gives its own), else `draft`."""
    sizes = {"min_n": DEFAULT_MIN_N, "max_n": DEFAULT_MAX_N, **ngram_sizes}
    return HybridProposer(NgramProposer(eos_ids, **sizes), draft)


def build_proposer(method: str, eos_ids: frozenset[int], ngram_sizes: dict, drafters: Drafters) -> Proposer | None:
    """The proposer of `method` (None for "none"); `ngram_sizes`: the request's n-gram options (min_n / max_n).
    "hybrid" on a bundle with a draft head and no draft model is "hybrid-head". Raises InvalidArgument naming what
    the bundle lacks."""
    if method == "none":
        return None
    if method in ("head", "hybrid-head") or (method == "hybrid" and drafters.draft is None
                                              and drafters.head is not None):
        if drafters.head is None:
            raise InvalidArgument(HEAD_MISSING)
        head = drafters.head()
        return head if method == "head" else hybrid(eos_ids, head, ngram_sizes)
    if method in ("draft", "hybrid"):
        if drafters.draft is None:
            raise InvalidArgument(f"method {method!r} needs a bundle compiled with --draft")
        draft = drafters.draft()
        return draft if method == "draft" else hybrid(eos_ids, draft, ngram_sizes)
    if method == "auto" and drafters.auto is not None:
        return drafters.auto()
    if method in ("ngram", "auto"):  # auto without its maker: n-gram chains (the batch makes its own: batch/trees.py)
        return NgramProposer(eos_ids, **ngram_sizes)
    if method == "recycle":  # prompt lookup + the bundle's successor table
        if drafters.recycle is None:
            raise InvalidArgument("method 'recycle' is not available here (no successor table)")
        return drafters.recycle()
    if method == "medusa":
        if drafters.medusa is None:
            raise InvalidArgument("method 'medusa' needs a bundle compiled with --medusa")
        return drafters.medusa()
    raise InvalidArgument(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
