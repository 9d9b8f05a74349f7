"""Issue 49 #4, #5, #8 on the batch engine: closing ends every waiter with an error (no hang), later calls raise at
once; explicit batch sizes are checked against memory before anything is allocated; prompts that are not a list of
prompts, or empty, are refused with a clear error. Every wait here is bounded, so a regression fails, never hangs."""

from __future__ import annotations

import threading
import time

import pytest

from specrt.core.errors import EngineClosed, InvalidArgument


@pytest.fixture(scope="module")
def gen(pair_bundle):
    from specrt.runtime import load

    return load(pair_bundle, backend="ort")


def _in_thread(fn):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["value"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _slow_steps(engine, seconds):
    """Every scheduler step takes `seconds` longer (a slow model; the real step still runs)."""
    step = engine.scheduler.step

    def slow():
        time.sleep(seconds)
        step()

    engine.scheduler.step = slow


def test_close_ends_in_flight_and_queued_requests_and_later_calls_raise_at_once(gen):
    engine = gen.engine(max_batch=1)
    _slow_steps(engine, 0.05)
    # two prompts on one slot: one runs, the other waits for the slot
    t, box = _in_thread(lambda: engine.generate_batch(["import os", "def f(x):"], 60, method="none"))
    seq, events = engine.submit("hello", max_new_tokens=60, method="none")
    # one running, two waiting (before: a 0.3 s sleep, after which a loaded machine might not have them there yet,
    # and close() then only met requests not yet submitted)
    deadline = time.monotonic() + 60
    while not (engine.scheduler.active == 1 and len(engine.scheduler.waiting) == 2):
        assert time.monotonic() < deadline, "the three requests never reached the scheduler"
        time.sleep(0.01)
    assert t.is_alive()
    engine.close()
    t.join(10)
    assert not t.is_alive(), "generate_batch still blocked after close()"
    assert isinstance(box["value"], EngineClosed) and "closed" in str(box["value"])
    t, box = _in_thread(lambda: list(engine.events(seq, events)))
    t.join(10)
    assert not t.is_alive(), "a submitted request's events still blocked after close()"
    assert isinstance(box["value"], EngineClosed)
    t0 = time.monotonic()
    for call in (lambda: engine.generate_batch(["import os"], 4), lambda: engine.submit("import os"),
                 lambda: list(engine.stream_tokens("import os", 4))):
        with pytest.raises(EngineClosed, match="closed"):
            call()
    assert time.monotonic() - t0 < 1.0
    engine.close()  # twice: fine
    assert gen.generate("import os", 3, method="none").token_ids  # the generator is still usable


def test_explicit_max_batch_beyond_memory_is_refused_before_allocating(gen, monkeypatch):
    from specrt.runtime.batch import memory

    per_slot = memory.kv_bytes_per_slot(gen)
    assert per_slot > 0
    # 4 slots' worth of memory available: 8 slots do not fit (small sizes, so a regression allocates little)
    monkeypatch.setattr(memory, "available_memory", lambda: 4 * per_slot)
    t0 = time.monotonic()
    with pytest.raises(InvalidArgument) as err:
        gen.engine(max_batch=8)
    message = str(err.value)
    assert "max_batch 8 needs 8 x" in message and "MiB" in message and "at most 3 slots fit" in message
    assert "\n" not in message and time.monotonic() - t0 < 1.0
    for bad in (0, -1, "8", 2.0, True):
        with pytest.raises(InvalidArgument, match="max_batch must be an integer >= 1"):
            gen.engine(max_batch=bad)


@pytest.mark.parametrize("prompts", [{"a": 1}, {"import os", "def f(x):"}, "import os", 7])
def test_prompts_that_are_not_a_list_of_prompts_are_refused(gen, prompts):
    engine = gen.engine(max_batch=2)
    try:
        with pytest.raises(InvalidArgument, match=f"prompts must be a list of prompts.*got {type(prompts).__name__}"):
            engine.generate_batch(prompts, 4)
    finally:
        engine.close()


def test_empty_prompts_are_refused_everywhere(gen, monkeypatch):
    """As the server refuses them, even where the model has a BOS token to start from (they were decoded from BOS)."""
    monkeypatch.setattr(gen, "bos_id", 1)
    engine = gen.engine(max_batch=2)
    try:
        with pytest.raises(InvalidArgument, match="prompt 1: empty prompt"):
            engine.generate_batch(["import os", ""], 4)
        with pytest.raises(InvalidArgument, match="prompt 0: empty prompt"):
            engine.generate_batch([[]], 4)
    finally:
        engine.close()
    for empty in ("", []):
        with pytest.raises(InvalidArgument, match="empty prompt"):
            gen.generate(empty, 4)


def test_engine_stream_tokens_ends_at_a_stop_string(gen):
    plain = gen.generate("import os\nimport sys\n", 24, method="none")
    i = len(plain.text) * 2 // 3
    stop = plain.text[i:i + 2]
    engine = gen.engine(max_batch=2)
    try:
        ids, stats = [], None
        for chunk, stats in engine.stream_tokens("import os\nimport sys\n", 24, method="none", stop=[stop]):
            ids.extend(chunk)
    finally:
        engine.close()
    assert stats.finish_reason == "stop" and stop in gen.tokenizer.decode(ids)
    assert ids == plain.token_ids[:len(ids)] and len(ids) < len(plain.token_ids)


def test_engine_stream_cuts_at_a_stop_string(gen):
    plain = gen.generate("import os\nimport sys\n", 24, method="none")
    i = len(plain.text) * 2 // 3
    stop = plain.text[i:i + 2]
    with gen.engine(max_batch=2) as engine:
        text = "".join(engine.stream("import os\nimport sys\n", 24, method="none", stop=stop))
    assert text == plain.text[:plain.text.find(stop)]
