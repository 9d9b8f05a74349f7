"""Issue 50 #2: a call is resolved once (`Generator.prepare` -> `PreparedRequest`), for every front end: the Python
API, the batch engine (`generate_batch`, `stream_tokens`), the CLI's prompt files and the server (tests/serve/
test_prepared_server.py). The spies count the real resolving functions while real ONNX Runtime sessions decode."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime import PreparedRequest
from specrt.runtime.prepared import ContextExceeded
from specrt.runtime.request import RequestFieldError

from helpers import resolve_counts

PROMPTS = ["def load(path):\n", "import json\n"]


def test_prepare_holds_the_checked_call(pair_generator):
    gen = pair_generator
    p = gen.prepare(PROMPTS[0], max_new_tokens=6, method="ngram", temperature=0)
    assert isinstance(p, PreparedRequest)
    assert p.prompt_ids.dtype == np.int64 and p.prompt_ids.tolist() == gen.encode_prompt(PROMPTS[0]).tolist()
    assert (p.method, p.max_new_tokens, p.context_limited, p.logits) == ("ngram", 6, False, None)
    assert p.request.sampling.greedy  # sampling defaults filled
    assert gen.prepare([5, 6], max_new_tokens=gen.max_seq_len).context_limited  # stops at the context
    assert gen.prepare("x").method == gen.default_method
    # the same output as the call given whole, and a prepared call runs again with the same result
    ref = gen.generate(PROMPTS[0], 6, method="ngram", temperature=0)
    assert gen.generate(p).token_ids == ref.token_ids == gen.generate(p).token_ids
    assert "".join(gen.stream(p)) == ref.text
    assert [t for ids, _ in gen.stream_tokens(p) for t in ids] == ref.token_ids


@pytest.mark.parametrize("call, error, field", [
    (dict(prompt=""), InvalidArgument, "prompt"),
    (dict(prompt=[1, 10**9]), InvalidArgument, "prompt"),
    (dict(prompt="x", num_speculative_tokens=99), RequestFieldError, "num_speculative_tokens"),
    (dict(prompt="x", method="medusa"), RequestFieldError, "method"),
    (dict(prompt="x", logit_bias={10**9: 1.0}), InvalidArgument, "logit_bias"),
    (dict(prompt=[1] * 10, max_new_tokens=10**4, strict=True), ContextExceeded, "max_new_tokens"),
])
def test_every_check_is_made_by_prepare(pair_generator, call, error, field):
    call = dict(call)  # the parameter is shared by both graph variants
    with pytest.raises(error) as exc:
        pair_generator.prepare(call.pop("prompt"), **call)
    assert getattr(exc.value, "field", None) == field
    assert pair_generator.generate("x", 2).finish_reason  # still usable


def test_a_prepared_call_is_given_alone(pair_generator):
    p = pair_generator.prepare("x", max_new_tokens=2)
    with pytest.raises(TypeError, match="PreparedRequest alone"):
        pair_generator.generate(p, 4)
    with pytest.raises(TypeError, match="PreparedRequest alone"):
        list(pair_generator.stream_tokens(p, temperature=0))
    with pytest.raises(InvalidArgument, match="policy must implement"):
        pair_generator.prepare("x", policy=object())


def test_a_compiled_constraint_serves_one_run_and_the_next_compiles_its_own(pair_generator):
    from specrt.runtime import ConstraintSpec

    p = pair_generator.prepare("x", max_new_tokens=10, constraint=ConstraintSpec.regex("(yes|no)!"), method="none")
    assert p._constraint  # compiled by prepare
    first, second = pair_generator.generate(p), pair_generator.generate(p)
    assert first.text == second.text and first.text in ("yes!", "no!"), first.text


def test_generate_and_batch_resolve_once(pair_bundle, monkeypatch):
    from specrt.runtime import load

    gen = load(pair_bundle, backend="ort")
    with gen, gen.engine(max_batch=2) as engine:
        with resolve_counts(monkeypatch) as counts:
            gen.generate(PROMPTS[0], 4, method="ngram")
        assert counts == dict(request=1, check_for=1, prompt_ids=1, context=1, batch_check=0)
        with resolve_counts(monkeypatch) as counts:
            results = engine.generate_batch(PROMPTS, 4, method="ngram")
        # one request for both prompts: resolved once; each prompt checked once
        assert counts == dict(request=1, check_for=1, prompt_ids=2, context=2, batch_check=2)
        assert [r.token_ids for r in results] == [gen.generate(p, 4, method="ngram").token_ids for p in PROMPTS]
        with resolve_counts(monkeypatch) as counts:
            ids = [t for chunk, _ in engine.stream_tokens(PROMPTS[1], 4, method="ngram") for t in chunk]
        assert counts == dict(request=1, check_for=1, prompt_ids=1, context=1, batch_check=1)
        assert ids == results[1].token_ids
        prepared = [gen.prepare(p, max_new_tokens=4, method="ngram") for p in PROMPTS]
        with resolve_counts(monkeypatch) as counts:
            again = engine.generate_batch(prepared)
        assert counts == dict(request=0, check_for=0, prompt_ids=0, context=0, batch_check=2)
        assert [r.token_ids for r in again] == [r.token_ids for r in results]
