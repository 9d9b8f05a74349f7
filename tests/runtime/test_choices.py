"""`generate_choices` (runtime/choices.py) and `GenerationRequest.for_choice`: n choices, choice i with seed + i,
greedy choices copies; on a Generator and on the batch engine, each equal to `generate` of the same request."""

from __future__ import annotations

import threading

import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.choices import generate_choices
from specrt.runtime.request import GenerationRequest, choice_seed

PROMPT = "def main(args):\n    "


def test_choice_seeds():
    req = GenerationRequest(temperature=0.7, seed=2**63 - 1)
    assert req.for_choice(0) is req
    assert req.for_choice(1).seed == 0 and req.for_choice(2).seed == 1  # wraps within [0, 2**63)
    assert GenerationRequest().for_choice(3).seed is None and choice_seed(None, 3) is None
    with pytest.raises(InvalidArgument, match="choice index"):
        req.for_choice(-1)


def test_generate_choices_on_a_generator(pair_generator):
    kw = dict(max_new_tokens=10, temperature=0.9, method="ngram", num_speculative_tokens=3)
    results = generate_choices(pair_generator, PROMPT, 3, seed=11, **kw)
    assert [r.text for r in results] == [pair_generator.generate(PROMPT, seed=11 + i, **kw).text for i in range(3)]
    greedy = generate_choices(pair_generator, PROMPT, 2, max_new_tokens=10)
    assert greedy[0].text == greedy[1].text == pair_generator.generate(PROMPT, 10).text
    with pytest.raises(InvalidArgument, match=r"n must be an integer in \[1, 16\]"):
        generate_choices(pair_generator, PROMPT, 17)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_generate_choices_on_the_batch_share_one_prefill(pair_generator, method):
    kw = dict(max_new_tokens=10, temperature=0.9, method=method, num_speculative_tokens=3)
    engine = pair_generator.engine(max_batch=4)
    try:
        results = generate_choices(engine, PROMPT, 3, seed=5, **kw)
        sharing = engine.scheduler.sharing
    finally:
        engine.close()
    assert [r.text for r in results] == [pair_generator.generate(PROMPT, seed=5 + i, **kw).text for i in range(3)]
    # the fused CPU pool: choices 1 and 2 copied choice 0's prompt rows; a batch runner (ort-portable) prefills each
    assert sharing.tokens == (2 * len(pair_generator.tokenizer.encode(PROMPT)) if sharing.enabled else 0)


def test_identical_prompts_share_one_prefill_also_from_a_running_sequence(pair_generator, monkeypatch):
    prompts = [PROMPT, "import os\n", PROMPT, PROMPT]
    alone = [pair_generator.generate(p, 12).text for p in prompts]
    engine = pair_generator.engine(max_batch=4)
    try:
        assert [r.text for r in engine.generate_batch(prompts, 12)] == alone  # admitted together: wait for one prefill
        together = engine.scheduler.sharing.tokens
        if not engine.scheduler.sharing.enabled:  # a batch runner: no row copy between its slots
            assert together == 0
            return
        # the first stays in the batch until the second is queued: its decoding steps wait (a step that does nothing)
        # while it runs alone (before: 110 tokens for the second to arrive within, which the engine thread could
        # decode first while this thread waited for the CPU)
        sched, real_step, arrived = engine.scheduler, engine.scheduler.step, []

        def step():
            if len(sched.waiting) + sched.active >= 2:
                arrived.append(True)
            if not arrived and sched.running and not sched.prefilling and not sched.waiting:
                threading.Event().wait(0.005)
                return
            real_step()

        monkeypatch.setattr(sched, "step", step)
        steps = engine.stream_tokens(PROMPT, 110)
        first = next(steps)[0]
        second = engine.generate_batch([PROMPT], 12)[0].text  # its rows are copied from the running first
        rest = [t for ids, _ in steps for t in ids]
        copied = engine.scheduler.sharing.tokens - together
    finally:
        engine.close()
    n = len(pair_generator.tokenizer.encode(PROMPT))
    assert together == 2 * n and copied == n
    assert second == alone[0] and pair_generator.tokenizer.decode(first + rest) == pair_generator.generate(PROMPT, 110).text
    monkeypatch.setenv("SPECRT_SHARED_PREFILL", "0")
    engine = pair_generator.engine(max_batch=4)
    try:
        assert [r.text for r in engine.generate_batch(prompts, 12)] == alone and engine.scheduler.sharing.tokens == 0
    finally:
        engine.close()
