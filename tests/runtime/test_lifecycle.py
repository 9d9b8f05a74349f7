"""Issue 50 #6: `close()` and `with` on runners and on `Generator`: the ONNX Runtime sessions are released (nothing
keeps them alive afterwards), closing twice is harmless, and later calls raise one clear error."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from specrt.core.errors import EngineClosed, GeneratorClosed


@pytest.mark.parametrize("backend", ["ort", "ort-portable"])
def test_generator_close_releases_its_sessions(pair_bundle, backend):
    from specrt.runtime import load

    with load(pair_bundle, backend=backend, warmup=False) as gen:
        expected = gen.generate("def f(x):", 4, method="draft").token_ids
        sessions = [weakref.ref(r.session) for r in (gen.target, gen.draft)]
        runners = (gen.target, gen.draft)
        prepared = gen.prepare("def f(x):", max_new_tokens=4, method="draft")
        assert gen.generate(prepared).token_ids == expected
    assert gen.closed and all(r.closed for r in runners)
    gc.collect()
    assert [ref() for ref in sessions] == [None, None]  # nothing holds a session any more
    gen.close()  # twice: nothing happens
    for call in (lambda: gen.generate("x", 2), lambda: list(gen.stream("x", 2)), lambda: gen.prepare("x"),
                 lambda: gen.generate(prepared), gen.engine):
        with pytest.raises(GeneratorClosed, match="closed: load the bundle again"):
            call()
    with pytest.raises(GeneratorClosed, match="runner is closed"):
        runners[0].forward(np.array([1, 2], dtype=np.int64))


def test_runner_close_and_with(pair_bundle):
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime import backends

    manifest = read_manifest(pair_bundle)
    with backends.create_runner(manifest, "target", "ort-portable", capacity=manifest.max_seq_len,
                                max_short_tokens=4) as runner:
        logits = runner.forward(np.array([1, 2, 3], dtype=np.int64))
        assert logits.shape == (3, runner.vocab_size) and runner.length == 3
        session = weakref.ref(runner.session)
    assert runner.closed and runner.length == 0
    gc.collect()
    assert session() is None
    runner.close()
    runner.reset()  # a closed runner has nothing to reset
    with pytest.raises(GeneratorClosed):
        runner.prefill(np.array([1], dtype=np.int64))


def test_generator_close_closes_its_batch_engines(pair_bundle):
    from specrt.runtime import load

    gen = load(pair_bundle, backend="ort", warmup=False)
    engine = gen.engine(max_batch=2)
    assert engine.generate_batch(["a", "b"], 2, method="none")
    gen.close()
    with pytest.raises(EngineClosed):
        engine.generate_batch(["a"], 2)
