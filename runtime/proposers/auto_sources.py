"""`auto_sources`: which of its sources `auto` (auto.py) merges into its tree, per request.

    GenerationRequest(auto_sources="ngram,recycle")   # only these two
    GenerationRequest(auto_sources="-head")           # every source the bundle has but the draft head
    specrt generate B --prompt ... --auto-sources=-head
    specrt bench B --suite spec-bench --methods ngram,auto[-head],auto    # one row per label

Sources: `ngram` (prompt lookup: the suffix n-gram's continuations), `recycle` (Token Recycling's successor table),
`draft` (a draft model, bundles compiled with --draft), `head` (a draft head, --draft head:DIR), `store` (a datastore of
the target's own answers, runtime/proposers/store.py, in bundles that carry one). None (the default):
every source the bundle has. A list names the sources to use; a list of names each with a leading '-' names the
sources to leave out (the rest of what the bundle has is used). Names are checked when the request is built
(`parse_sources`), availability against the bundle when the Generator resolves the request (`resolve`): the
resolved request carries the explicit list of sources, so nothing downstream parses it again. Under batching
`auto` drafts from `ngram`, `recycle` and `store` (runtime/batch/trees.py): `draft` and `head` are not used there.
"""

from __future__ import annotations

from typing import Any

from specrt.core.errors import InvalidArgument

SOURCES = ("ngram", "recycle", "draft", "head", "store")
BATCH_SOURCES = ("ngram", "recycle", "store")
NEEDS = {"draft": "a bundle compiled with --draft", "head": "a bundle compiled with --draft head:DIR",
         "store": "a bundle with a datastore: `specrt store BUNDLE --from TEXTS`"}
FIELD = "auto_sources"  # the request field: callers raise these errors as RequestFieldError(FIELD, ...)


def parse_sources(value: Any) -> tuple[str, ...] | None:
    """A comma-separated string or a sequence of names -> their tuple (in the order given, once each); None stays
    None. Unknown names, an empty list, and inclusions mixed with exclusions ('-name') are refused."""
    if value is None:
        return None
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise InvalidArgument(f"auto_sources must be a comma-separated string or a list of source names, got {value!r}")
    items = [v for v in items if v]
    if not items:
        raise InvalidArgument(f"auto_sources must name at least one source of {', '.join(SOURCES)}, got {value!r}")
    for v in items:
        if v.lstrip("-") not in SOURCES or v.startswith("--"):
            raise InvalidArgument(f"unknown auto source {v!r}; choose from {', '.join(SOURCES)} (a leading '-' leaves one out)")
    excluded = [v.startswith("-") for v in items]
    if any(excluded) and not all(excluded):
        raise InvalidArgument(f"auto_sources either names the sources to use or, each with a leading '-', those to leave "
                     f"out, not both: got {','.join(items)}")
    return tuple(dict.fromkeys(items))


def available(gen) -> tuple[str, ...]:
    """The sources `auto` has on `gen` (a Generator): what `make_auto` builds. A fused head whose layers the target
    backend does not hand out is not one (head_source.py `head_source`)."""
    out = ["ngram", "recycle"]
    if gen.draft is not None:
        out.append("draft")
    head = gen.manifest.draft_head
    if head is not None:
        layers = head.feature_layers
        if not layers or gen.target.hidden_layers == len(layers):
            out.append("head")
    from specrt.runtime.proposers.store import CORPUS_FILE

    if CORPUS_FILE in gen.manifest.files:
        out.append("store")
    return tuple(out)


def resolve(spec: tuple[str, ...] | None, have: tuple[str, ...]) -> tuple[str, ...] | None:
    """The sources of a request on a bundle that has `have` (None: all of them); every name must be one it has."""
    if spec is None:
        return None
    for v in spec:
        name = v.lstrip("-")
        if name not in have:
            needs = f" (it needs {NEEDS[name]})" if name in NEEDS else ""
            raise InvalidArgument(f"auto source {name!r} is not available with this bundle{needs}; its auto sources: "
                         f"{', '.join(have)}")
    chosen = tuple(s for s in have if f"-{s}" not in spec) if spec[0].startswith("-") else spec
    if not chosen:
        raise InvalidArgument(f"auto_sources={','.join(spec)} leaves auto no source: use method 'none' for plain decoding")
    return tuple(s for s in SOURCES if s in chosen)


def check_method(spec: tuple[str, ...] | None, method: str | None) -> None:
    """auto_sources applies to method auto (None: the default, auto)."""
    if spec is not None and method not in (None, "auto"):
        raise InvalidArgument(f"auto_sources applies to method 'auto', got method {method!r}")


def batch_sources(spec: tuple[str, ...] | None) -> frozenset[str]:
    """The sources the batch's `auto` uses for a resolved request (runtime/batch/trees.py)."""
    return frozenset(BATCH_SOURCES if spec is None else spec) & frozenset(BATCH_SOURCES)


def batch_refusal(spec: tuple[str, ...] | None) -> str:
    """Why the batch cannot run a resolved request's `auto` ("" when it can): nothing left of BATCH_SOURCES."""
    if spec is not None and not batch_sources(spec):
        return (f"auto_sources={','.join(spec)}: under batching auto drafts from ngram and recycle only (and store "
                "where the bundle has a datastore); name one of them, or serve without --max-batch")
    return ""
