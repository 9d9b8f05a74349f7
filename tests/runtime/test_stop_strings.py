"""Issue 49 #6: stop strings are honoured wherever a request takes them (Generator.generate / stream /
stream_tokens, BatchEngine.generate_batch): the text is cut before the first one, the generation ends with the step
that reached it, finish_reason "stop"."""

import pytest

PROMPT = "import os\nimport sys\n"
N = 24


@pytest.fixture(scope="module")
def plain(pair_generator):
    res = pair_generator.generate(PROMPT, N, method="none")
    assert res.finish_reason == "length" and len(res.text) > 8
    return res


def _stop_of(text):
    """A stop string from the middle of `text`, and the text before its first occurrence."""
    i = len(text) * 2 // 3
    stop = text[i:i + 2]
    return stop, text[:text.find(stop)]


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_generate_cuts_at_a_stop_string(pair_generator, plain, method):
    stop, expected = _stop_of(plain.text)
    res = pair_generator.generate(PROMPT, N, method=method, stop=[stop])
    assert res.text == expected
    assert res.finish_reason == "stop" and res.stats.finish_reason == "stop"
    assert res.token_ids == plain.token_ids[:len(res.token_ids)] and len(res.token_ids) < len(plain.token_ids)


def test_stream_cuts_at_a_stop_string(pair_generator, plain):
    stop, expected = _stop_of(plain.text)
    assert "".join(pair_generator.stream(PROMPT, N, method="none", stop=stop)) == expected


def test_stream_tokens_ends_at_the_step_with_the_stop_string(pair_generator, plain):
    stop, expected = _stop_of(plain.text)
    ids, stats = [], None
    for chunk, stats in pair_generator.stream_tokens(PROMPT, N, method="none", stop=[stop]):
        ids.extend(chunk)
    assert stats.finish_reason == "stop" and len(ids) < len(plain.token_ids)
    assert stop in pair_generator.tokenizer.decode(ids) and ids == plain.token_ids[:len(ids)]


def test_a_stop_string_never_reached_changes_nothing(pair_generator, plain):
    res = pair_generator.generate(PROMPT, N, method="none", stop=["\x00never"])
    assert (res.text, res.token_ids, res.finish_reason) == (plain.text, plain.token_ids, "length")


def test_generate_and_generate_batch_cut_alike(self_bundle):
    from specrt.runtime import load

    gen = load(self_bundle, backend="ort")
    text = gen.generate(PROMPT, N, method="none").text
    stop, expected = _stop_of(text)
    one = gen.generate(PROMPT, N, method="none", stop=[stop])
    engine = gen.engine(max_batch=2)
    try:
        batch = engine.generate_batch([PROMPT, PROMPT], N, method="none", stop=[stop])
    finally:
        engine.close()
    assert [r.text for r in batch] == [one.text] * 2 == [expected] * 2
    assert [r.finish_reason for r in batch] == [one.finish_reason] * 2 == ["stop"] * 2
