"""`auto_sources` (runtime/proposers/auto_sources.py): which sources method auto drafts from, per request.

On the toy target-only bundle: with only `ngram` every drafted node is a prompt-lookup one, with only `recycle` a
successor-table one, the default drafts from both; greedy output stays plain's whatever the sources; bad names,
sources the bundle lacks and the option on another method are refused with one clear message (API, CLI); the batch
runs a request's sources too. The draft head's exclusion is tested on an oracle head (tests/runtime/
test_head_source.py)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import run_cli
from specrt.core.errors import InvalidArgument
from specrt.runtime import load
from specrt.runtime.proposers.auto_sources import parse_sources, resolve
from specrt.runtime.request import GenerationRequest, RequestFieldError

REPEATS = "the cat sat on the mat and the cat sat on the"


@pytest.fixture(scope="module")
def gen(target_only_bundle):
    g = load(target_only_bundle, threads=1)
    yield g
    g.close()


def test_names_are_checked_when_the_request_is_built():
    assert GenerationRequest().auto_sources is None  # the default: every source the bundle has
    assert GenerationRequest(auto_sources="ngram, recycle").auto_sources == ("ngram", "recycle")
    assert GenerationRequest(auto_sources=["-head", "-draft"]).auto_sources == ("-head", "-draft")
    for bad, says in (("ngrams", "unknown auto source 'ngrams'; choose from ngram, recycle, draft, head"),
                      ("ngram,-head", "not both"), ("", "at least one source"), (3, "comma-separated string"),
                      ("--head", "unknown auto source '--head'")):
        with pytest.raises(RequestFieldError, match=says) as info:
            GenerationRequest(auto_sources=bad)
        assert info.value.field == "auto_sources" and "\n" not in str(info.value)
    with pytest.raises(RequestFieldError, match="auto_sources applies to method 'auto', got method 'ngram'"):
        GenerationRequest(method="ngram", auto_sources="ngram")


def test_resolution_against_what_the_bundle_has():
    have = ("ngram", "recycle", "head")
    assert resolve(None, have) is None
    assert resolve(("-head",), have) == ("ngram", "recycle")
    assert resolve(("recycle", "ngram"), have) == ("ngram", "recycle")  # canonical order
    with pytest.raises(InvalidArgument, match="'draft' is not available with this bundle \\(it needs a bundle "
                                              "compiled with --draft\\); its auto sources: ngram, recycle, head"):
        resolve(("draft",), have)
    with pytest.raises(InvalidArgument, match="leaves auto no source: use method 'none'"):
        resolve(("-ngram", "-recycle", "-head"), have)
    assert parse_sources("ngram,ngram") == ("ngram",)


def _sources_of_drafted_nodes(gen, sources, prompt=REPEATS):
    """The sources (keys) of the nodes auto proposes on `prompt`, its table taught by a plain run of it."""
    gen.generate(prompt, 24, method="recycle")  # the table learns the prompt's rows (it is shared by the bundle)
    req = gen.request("generate", auto_sources=sources) if sources else gen.request("generate")
    proposer = gen.make_proposer("auto", req.sampling, np.random.default_rng(0), {}, req.auto_sources)
    ids = gen.encode_prompt(prompt)
    tokens = np.zeros(gen.max_seq_len, np.int64)
    tokens[:ids.size] = ids
    proposer.start(tokens, int(ids.size))
    _, keys = proposer.candidates(tokens, int(ids.size), 6)
    return {k[0] for ks in keys for k in ks}


def test_only_the_chosen_sources_propose(gen):
    both = _sources_of_drafted_nodes(gen, None)
    assert both & {"ngram", "ngram1", "ngramL"} and both & {"table", "tablep"}, both  # the default: both sources
    assert _sources_of_drafted_nodes(gen, "ngram") <= {"ngram", "ngram1", "ngramL"}
    assert _sources_of_drafted_nodes(gen, "ngram")  # the repeated text gives n-gram candidates
    assert _sources_of_drafted_nodes(gen, "recycle") <= {"table", "tablep"}
    assert _sources_of_drafted_nodes(gen, "-ngram") <= {"table", "tablep"}


def test_greedy_output_is_plain_whatever_the_sources(gen):
    plain = gen.generate(REPEATS, 32, method="none").token_ids
    for sources in (None, "ngram", "recycle", "-recycle"):
        res = gen.generate(REPEATS, 32, auto_sources=sources)
        assert res.token_ids == plain and res.stats.method == "auto", sources


def test_a_source_the_bundle_lacks_is_refused(gen):
    with pytest.raises(RequestFieldError, match="auto source 'head' is not available with this bundle"):
        gen.generate(REPEATS, 4, auto_sources="head")
    with pytest.raises(RequestFieldError, match="auto source 'draft' is not available"):
        gen.generate(REPEATS, 4, auto_sources="-draft")


def test_the_cli_option(target_only_bundle):
    ok = run_cli("generate", target_only_bundle, "--prompt", REPEATS, "--max-new-tokens", "8", "--auto-sources=-recycle",
                 "--json")
    assert ok.returncode == 0, ok.stderr
    plain = run_cli("generate", target_only_bundle, "--prompt", REPEATS, "--max-new-tokens", "8", "--method", "none",
                    "--json")
    assert '"token_ids"' in ok.stdout and ok.stdout.split('"token_ids"')[1].split("]")[0] == \
        plain.stdout.split('"token_ids"')[1].split("]")[0]
    for args, says in ((("--auto-sources", "bogus"), "error: unknown auto source 'bogus'"),
                       (("--auto-sources", "head"), "error: auto source 'head' is not available with this bundle"),
                       (("--method", "ngram", "--auto-sources", "ngram"),
                        "error: --auto-sources applies to method 'auto', got method 'ngram'")):
        r = run_cli("generate", target_only_bundle, "--prompt", REPEATS, "--max-new-tokens", "4", *args)
        assert r.returncode == 2 and r.stderr.startswith(says) and r.stderr.count("\n") == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_the_batch_runs_a_requests_sources(gen, monkeypatch):
    from specrt.runtime.batch import trees

    plain = gen.generate(REPEATS, 24, method="none").token_ids
    made, real = [], trees.tree_proposer
    monkeypatch.setattr(trees, "tree_proposer", lambda *a, **kw: made.append(real(*a, **kw)) or made[-1])
    with gen.engine(max_batch=2) as eng:
        results = eng.generate_batch([REPEATS, REPEATS], 24, auto_sources="ngram")
    assert [r.token_ids for r in results] == [plain, plain]
    assert len(made) == 2 and all(p.sources == {"ngram"} for p in made)
