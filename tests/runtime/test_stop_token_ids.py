"""vLLM's `stop_token_ids` and `ignore_eos` (docs/requests.md): a stop id ends the output as EOS does (kept in
token_ids, finish_reason "stop"), `ignore_eos` lets the model's EOS pass; the same tokens for every method, alone
and on the batch engine, as plain decoding with the same stop set; bad values name the field."""

import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime import load

PROMPT = "def add(a, b):\n    return"
METHODS = ("none", "ngram", "auto", "draft")


@pytest.fixture(scope="module")
def gen(pair_bundle):
    return load(pair_bundle, warmup=False)


@pytest.fixture(scope="module")
def plain(gen):
    return gen.generate(PROMPT, 48, method="none").token_ids


def first_repeat_free(ids: list[int]) -> tuple[int, int]:
    """(index, token) of the first token from index 4 on that did not occur before it."""
    for i in range(4, len(ids)):
        if ids[i] not in ids[:i]:
            return i, ids[i]
    raise AssertionError("no fresh token in the output")


def test_a_stop_token_id_ends_the_output_where_plain_decoding_emits_it(gen, plain):
    i, t = first_repeat_free(plain)
    for method in METHODS:
        res = gen.generate(PROMPT, 48, method=method, stop_token_ids=[t])
        assert res.token_ids == plain[:i + 1] and res.finish_reason == "stop", method
    engine = gen.engine(max_batch=4)
    try:
        out = engine.generate_batch([PROMPT, PROMPT], 48, method="auto", stop_token_ids=[t])
    finally:
        engine.close()
    assert [r.token_ids for r in out] == [plain[:i + 1]] * 2 and {r.finish_reason for r in out} == {"stop"}


def test_ignore_eos_lets_the_models_eos_pass(pair_bundle, plain):
    """A model whose EOS is a token its greedy output holds (the bundle's EOS id replaced by it): without ignore_eos
    the output ends there; with it, it is plain decoding's whole output (finish_reason length)."""
    gen = load(pair_bundle, warmup=False)
    i, t = first_repeat_free(plain)
    gen.eos_ids = frozenset({t})  # the model's EOS for this test (the manifest's id never comes up here)
    for method in METHODS:
        assert gen.generate(PROMPT, 48, method=method).token_ids == plain[:i + 1], method
        res = gen.generate(PROMPT, 48, method=method, ignore_eos=True)
        assert res.token_ids == plain and res.finish_reason == "length", method
    engine = gen.engine(max_batch=4)
    try:
        out = engine.generate_batch([PROMPT, PROMPT], 48, method="auto", ignore_eos=True)
        stopped = engine.generate_batch([PROMPT], 48, method="ngram")
    finally:
        engine.close()
    assert [r.token_ids for r in out] == [plain] * 2 and stopped[0].token_ids == plain[:i + 1]


@pytest.mark.parametrize("options, field", [
    ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"stop_token_ids": "7"}, "stop_token_ids"),
    ({"stop_token_ids": [True]}, "stop_token_ids"), ({"stop_token_ids": [10 ** 9]}, "stop_token_ids"),
    ({"stop_token_ids": list(range(65))}, "stop_token_ids"), ({"ignore_eos": 1}, "ignore_eos"),
    ({"ignore_eos": True, "json_object": True}, "ignore_eos"),
])
def test_bad_values_name_the_field(gen, options, field):
    from specrt.runtime.constraint import ConstraintSpec

    if options.pop("json_object", False):
        options["constraint"] = ConstraintSpec.json_object()
    with pytest.raises(InvalidArgument) as err:
        gen.generate(PROMPT, 4, **options)
    assert getattr(err.value, "field", None) == field and field in str(err.value), str(err.value)
