"""The pure penalty / logit_bias / logprob functions (runtime/logits_processors.py) against a from-scratch
reference: every row of a verify pass sees the counts as of its position."""

import numpy as np
import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.logits_processors import LogitsParams, LogitsState, log_softmax, process, token_logprobs


def reference_row(logits_row, params, prompt, generated):
    """One row from scratch, as OpenAI (presence / frequency over generated tokens) and transformers
    (repetition over prompt + generated) define them, after logit_bias."""
    x = logits_row.astype(np.float64).copy()
    for t, b in params.logit_bias:
        x[t] = -np.inf if b <= -100 else x[t] + b
    for t in set(prompt) | set(generated):
        x[t] = x[t] / params.repetition_penalty if x[t] > 0 else x[t] * params.repetition_penalty
    for t in set(generated):
        c = generated.count(t)
        x[t] -= params.frequency_penalty * c + params.presence_penalty
    return x


@pytest.mark.parametrize("params", [
    LogitsParams(presence_penalty=0.7), LogitsParams(frequency_penalty=-0.4), LogitsParams(repetition_penalty=1.6),
    LogitsParams(repetition_penalty=0.5), LogitsParams(logit_bias={3: 5.0, "7": -100, 9: -2.5}),
    LogitsParams(presence_penalty=1.0, frequency_penalty=0.5, repetition_penalty=1.3, logit_bias={2: 1.0}),
])
def test_each_verify_row_sees_the_counts_as_of_its_position(params):
    rng = np.random.default_rng(0)
    v = 12
    prompt, generated, fed = [1, 4, 4], [5, 6, 5], [6, 2, 2, 8]
    state = LogitsState(params, v, np.array(prompt))
    state.commit(generated[:1])
    state.apply(rng.normal(size=(1, v)).astype(np.float32), np.array([], dtype=np.int64))
    state.commit(generated[1:])  # commits accumulate: incremental counts equal counts from scratch
    logits = rng.normal(scale=3.0, size=(len(fed) + 1, v)).astype(np.float32)  # [S, V]
    out = state.apply(logits, np.array(fed))
    for i in range(len(fed) + 1):
        want = reference_row(logits[i], params, prompt, generated + fed[:i])
        np.testing.assert_allclose(out[i], want, rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(logits, logits.copy())  # input untouched


def test_ban_is_never_chosen_and_bias_moves_the_argmax():
    logits = np.array([[5.0, 1.0, 0.0, -1.0]], dtype=np.float32)
    empty = np.zeros(4, np.int32), np.zeros(4, bool), np.array([], np.int64)
    out = process(logits, LogitsParams(logit_bias={0: -100}), *empty)
    assert out[0, 0] == -np.inf and out[0].argmax() == 1
    assert process(logits, LogitsParams(logit_bias={3: 7}), *empty)[0].argmax() == 3
    lp = log_softmax(out)
    assert np.exp(lp[0]).sum() == pytest.approx(1.0) and lp[0, 0] == -np.inf


def test_token_logprobs_are_log_softmax_with_sorted_top():
    rows = np.array([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 1.0]], dtype=np.float32)
    out = token_logprobs(rows, [2, 0], 3)
    lp = log_softmax(rows)
    assert [t.token_id for t in out] == [2, 0]
    assert out[0].logprob == pytest.approx(lp[0, 2]) and out[1].logprob == pytest.approx(lp[1, 0])
    assert [t for t, _ in out[0].top] == [1, 2, 0]
    assert token_logprobs(rows, [1], 0)[0].top == ()


@pytest.mark.parametrize("kw, field", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"), (dict(logit_bias={"x": 1}), "logit_bias"),
    (dict(logit_bias={1: 101}), "logit_bias"), (dict(logit_bias={-1: 1}), "logit_bias"),
    (dict(logit_bias={"01": 1}), "logit_bias"), (dict(logit_bias={" 1": 1}), "logit_bias"),
    (dict(logit_bias={"\u0661": 1}), "logit_bias"), (dict(logit_bias={"1": 1, 1: 2}), "logit_bias"),
    (dict(logprobs=21), "logprobs"), (dict(logprobs=True), "logprobs"),
])
def test_out_of_range_values_name_the_field(kw, field):
    with pytest.raises(InvalidArgument) as err:
        LogitsParams(**kw)
    assert err.value.field == field and field in str(err.value)


def test_bias_beyond_the_vocabulary_is_refused():
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        LogitsParams(logit_bias={50: 1}).check_vocab(50)
