"""Generator safety (issue 10 #7, #8): no NaN reaches sampling; an open stream never deadlocks the generator."""

import gc
import threading

import numpy as np
import pytest

from specrt.core.errors import BackendError, InvalidArgument
from specrt.runtime.sampling import MIN_TEMPERATURE, SamplingParams, warp


def run_with_timeout(fn, timeout=60.0):
    """Run fn() in a daemon thread; return (finished, result or exception)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["value"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive(), box.get("value")


@pytest.mark.parametrize("t", [5e-324, 1e-300, MIN_TEMPERATURE / 2, float("inf"), float("nan")])
def test_temperatures_outside_the_documented_range_are_refused(pair_generator, t):
    with pytest.raises(InvalidArgument, match="temperature"):
        pair_generator.generate("import os", 4, temperature=t, seed=0)


def test_smallest_allowed_temperature_samples_without_nan(pair_generator):
    res = pair_generator.generate("import os", 8, temperature=MIN_TEMPERATURE, seed=0)
    greedy = pair_generator.generate("import os", 8)
    assert res.token_ids == greedy.token_ids  # T = 1e-3 is argmax in practice on these logits


def test_non_finite_logits_never_reach_sampling():
    logits = np.zeros((2, 10))
    logits[1, 3] = np.nan
    with pytest.raises(BackendError, match="non-finite"):
        warp(logits, SamplingParams(temperature=1.0))


def test_open_stream_in_same_thread_is_run_out_not_a_deadlock(pair_generator):
    """Issue 49 #5: a call in the thread that holds a half-read stream runs the stream's rest into its buffer, then
    runs; the stream still reads its whole, unchanged text."""
    whole = "".join(pair_generator.stream("import os", 20, method="none"))

    def scenario():
        it = pair_generator.stream("import os", 20, method="none")
        first = next(it)
        ids = pair_generator.generate("import os", 3, method="none").token_ids  # same thread, stream still open
        return first + "".join(it), ids

    finished, value = run_with_timeout(scenario)
    assert finished, "generate() deadlocked behind an open stream in the same thread"
    text, ids = value
    assert text == whole and len(ids) == 3


def test_a_call_from_inside_a_step_is_a_clear_error_not_a_deadlock(pair_generator):
    seen = []

    def hook(k, drafted, accepted):
        try:
            pair_generator.generate("import os", 2, method="none")
        except InvalidArgument as exc:
            seen.append(str(exc))

    finished, value = run_with_timeout(lambda: pair_generator.generate("import os", 6, method="ngram",
                                                                       num_speculative_tokens=2, on_step=hook))
    assert finished, "a generate() from an on_step hook deadlocked"
    assert not isinstance(value, BaseException), value
    assert seen and "inside a step" in seen[0]


def test_abandoned_stream_releases_the_generator(pair_generator):
    it = pair_generator.stream("import os", 20, method="none")
    next(it)
    del it
    gc.collect()
    finished, value = run_with_timeout(lambda: pair_generator.generate("import os", 3, method="none"))
    assert finished and not isinstance(value, BaseException), value


def test_other_thread_does_not_wait_for_an_unread_stream(pair_generator):
    """Issue 49 #5 (round 2's D12): a half-read stream held open by one thread does not block another thread's
    generate: the caller runs the stream's remaining steps (bounded by its max_new_tokens), then its own; the
    stream's reader gets the rest of its text unchanged."""
    whole = "".join(pair_generator.stream("import os", 20, method="none"))
    it = pair_generator.stream("import os", 20, method="none")
    first = next(it)
    finished, value = run_with_timeout(lambda: pair_generator.generate("import os", 3, method="none"), timeout=30.0)
    assert finished, "generate() from another thread waited for the stream's reader"
    assert not isinstance(value, BaseException) and len(value.token_ids) == 3, value
    assert first + "".join(it) == whole
