"""Issue 49 #6: stop strings are honoured wherever a request takes them (Generator.generate / stream /
stream_tokens, BatchEngine.generate_batch): the text is cut before the first one, the output ends with the token
that completed it (not the rest of its speculative step), finish_reason "stop"."""

import numpy as np
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


def _stops_and_steps(gen, **kw):
    """Two-character stop strings from the middle of `gen`'s plain text, and the steps (token chunks) of the same
    request under `kw` without stop strings."""
    text = gen.generate(PROMPT, N, method="none").text
    stops = sorted({text[i:i + 2] for i in range(len(text) // 4, len(text) - 2, 2)
                    if text[i:i + 2].strip() and "\ufffd" not in text[i:i + 2]})
    return text, stops, [list(c) for c, _ in gen.stream_tokens(PROMPT, N, temperature=0, **kw)]


def test_the_output_ends_at_the_token_that_completes_the_stop_string_however_the_steps_group_it(self_generator):
    """A speculative step that accepts several tokens can complete a stop string with one of them and carry more
    after it: those are not output (ids, new_tokens, logprobs), so every method reports the same tokens as plain
    decoding, token for token (they reported the whole stop step's tokens, so the counts hung on the grouping).
    The target as its own draft at k = 4: every step carries 5 tokens."""
    from specrt.core.tokenizer import TextStage

    gen, tok = self_generator, self_generator.tokenizer
    spec = dict(method="draft", num_speculative_tokens=4)
    text, stops, chunks = _stops_and_steps(gen, **spec)
    mid_step = 0
    for stop in stops:
        ref = gen.generate(PROMPT, N, method="none", stop=[stop], logprobs=1)  # one token a step
        assert ref.finish_reason == "stop" and stop in tok.decode(ref.token_ids)
        for kw in (spec, dict(method="auto")):
            res = gen.generate(PROMPT, N, stop=[stop], logprobs=1, temperature=0, **kw)
            assert res.finish_reason == "stop" and res.text == ref.text == text[:text.find(stop)]
            assert res.token_ids == ref.token_ids, (stop, kw)
            assert res.stats.new_tokens == len(ref.token_ids) and len(res.logprobs) == len(ref.token_ids)
            assert [lp.token_id for lp in res.logprobs] == [lp.token_id for lp in ref.logprobs] == ref.token_ids
            streamed = [t for chunk, _ in gen.stream_tokens(PROMPT, N, stop=[stop], temperature=0, **kw) for t in chunk]
            assert streamed == ref.token_ids
        stage = TextStage(tok, [stop])  # was the stop string completed inside a step carrying tokens past it?
        for chunk in chunks:
            stage.push(chunk)
            if stage.stopped:
                mid_step += stage.kept < len(chunk)
                break
    assert mid_step > 0


def test_the_batch_output_stage_ends_a_request_at_the_token_that_completes_its_stop_string(self_generator):
    """The batch's per-request output stage (runtime/batch/streams.py) fed the steps of a speculative run as the
    engine emits them: the stop step's ids stop at the token that completed the stop string, and new_tokens counts
    the output (a step emitted after the stop, as the engine's next step may be, adds nothing)."""
    import threading
    import types

    from specrt.runtime.batch.streams import END, RequestOutput
    from specrt.runtime.stats import GenerationStats

    gen = self_generator
    _, stops, chunks = _stops_and_steps(gen, method="draft", num_speculative_tokens=4)
    for stop in stops:
        ref = gen.generate(PROMPT, N, method="none", stop=[stop])
        events = []
        out = RequestOutput(gen.tokenizer, [stop], events.append)
        seq = types.SimpleNamespace(cancel=threading.Event(), stats=GenerationStats(method="draft"))
        for chunk in chunks + [chunks[-1]]:
            seq.stats.new_tokens += len(chunk)
            out(chunk, seq)
        out([], seq)
        steps = [ev for ev in events if ev is not END]
        assert events[-1] is END and seq.cancel.is_set() and seq.stats.finish_reason == "stop"
        assert [t for step in steps for t in step.ids] == ref.token_ids
        assert "".join(step.text for step in steps) == ref.text and seq.stats.new_tokens == len(ref.token_ids)


def test_the_first_stop_string_to_complete_ends_the_output(pair_generator, plain):
    """Read token by token, the stop string completed first wins, even where another one starts earlier in the
    text and would complete later (as vLLM's per-token check): the same whatever the steps' grouping."""
    from specrt.core.tokenizer import TextStage

    tok = pair_generator.tokenizer
    ids = plain.token_ids
    whole = tok.decode(ids)
    n = next(n for n in range(4, len(ids)) if len(tok.decode(ids[:n])) >= 6 and tok.decode(ids[:n])[-1].strip())
    first = tok.decode(ids[:n])
    late = first[-3:] + whole[len(first):len(first) + 4]  # starts before the early one's end, completes after it
    early = first[-1]
    results = []
    for grouping in (1, 3, len(ids)):
        stage = TextStage(tok, [late, early])
        out, kept = [], []
        for i in range(0, len(ids), grouping):
            chunk = ids[i:i + grouping]
            out.append(stage.push(chunk))
            kept += chunk[:stage.kept]
            if stage.stopped:
                break
        assert stage.stopped and "".join(out) == whole[:whole.find(early)]
        results.append(kept)
    assert results[0] == results[1] == results[2] and len(results[0]) < len(ids)
