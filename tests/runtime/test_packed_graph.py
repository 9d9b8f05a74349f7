"""The packed graph (runtime/backends/ort/packed_graph.py) of every fused architecture: Llama (packed QKV), Qwen3
(q/k norms: separate q, k, v inputs), Gemma 3 (sliding-window layers, two rope caches, soft-capped logits). One
packed pass over several sequences gives each the logits of its own call alone, bit for bit, on real ONNX Runtime
sessions: prefill chunks, one-token decodes and verify passes, pasts that cross Gemma 3's window, and a region that
is not in the pass keeps its KV untouched."""

import numpy as np
import pytest

from helpers import GEMMA3_WINDOW, make_checkpoint

from specrt.compiler.fused_graph import fused_onnx_from_decoder
from specrt.models.checkpoint import open_checkpoint
from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
from specrt.runtime.batch.pool import RegionPool

CAPACITY = 48


@pytest.fixture(scope="module", params=("llama", "qwen3", "gemma3"))
def fused(request, workdir, tokenizer_path):
    path = make_checkpoint(workdir / "packed" / request.param, request.param, tokenizer_path, layers=2, seed=3)
    decoder = open_checkpoint(path).load_decoder()
    onnx_path = fused_onnx_from_decoder(decoder, workdir / "packed" / f"{request.param}.fused.onnx", CAPACITY)
    return onnx_path, decoder.config


def test_packed_pass_equals_each_call_alone(fused):
    onnx_path, config = fused
    alone = OrtFusedRunner(onnx_path, config, CAPACITY, 8)
    pool = RegionPool(OrtFusedRunner(onnx_path, config, CAPACITY, 8), 4)
    packed = pool.packed()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, config.vocab_size, n) for n in (9, 2 * GEMMA3_WINDOW + 3, 4, 5)]
    runners = [pool.acquire() for _ in range(4)]
    history = [[] for _ in range(4)]  # every call each region made, for the reference runs

    def run(step):  # step: {region: ids}; regions not in it keep their KV
        calls = [(b, ids, runners[b].length, (0, ids.size)) for b, ids in step.items()]
        untouched = {b: pool.keys[0][b].copy() for b in range(4) if b not in step}
        got = [o.copy() for o in packed.run(calls)]
        for b, ids in step.items():
            runners[b].cache.length += ids.size
        for b, before in untouched.items():
            np.testing.assert_array_equal(pool.keys[0][b], before)
        for (b, ids, _, _), logits in zip(calls, got):
            alone.reset()
            for prev in history[b]:
                alone.forward(prev)
            np.testing.assert_array_equal(logits, alone.forward(ids), err_msg=f"{config.architecture} region {b}")
            history[b].append(ids)

    run({0: prompts[0], 1: prompts[1][:7], 3: prompts[3]})  # region 2 idle
    run({1: prompts[1][7:], 2: prompts[2], 0: np.array([5])})  # prefill with a past, prefill, one-token decode
    run({0: np.array([6, 7, 8]), 1: np.array([9]), 2: np.array([1, 2]), 3: np.array([3, 4, 5, 6])})  # verify passes
    assert runners[1].length > GEMMA3_WINDOW * 2


def test_packed_sizes(monkeypatch):
    from specrt.core.errors import InvalidArgument
    from specrt.runtime.batch.packed import PACKED_SIZES_ENV, packed_sizes

    monkeypatch.delenv(PACKED_SIZES_ENV, raising=False)
    assert packed_sizes(8) == [2, 4, 8]
    assert packed_sizes(6) == [3, 6]
    assert packed_sizes(1) == [1]
    monkeypatch.setenv(PACKED_SIZES_ENV, "8")
    assert packed_sizes(8) == [8]
    monkeypatch.setenv(PACKED_SIZES_ENV, "3, 16")  # counts above max_batch are dropped, max_batch always kept
    assert packed_sizes(8) == [3, 8]
    for bad in ("two", "0,8"):
        monkeypatch.setenv(PACKED_SIZES_ENV, bad)
        with pytest.raises(InvalidArgument, match=PACKED_SIZES_ENV):
            packed_sizes(8)


def test_smallest_covering_graph_runs_and_gives_the_same_bits(fused, monkeypatch):
    """A pass over regions [0, 2) of a 4-region pool runs on the 2-slot graph (the idle slots of the 4-slot graph
    would each run an attention node per layer), with the logits of the 4-slot graph, bit for bit."""
    from specrt.runtime.batch.packed import PACKED_SIZES_ENV

    monkeypatch.delenv(PACKED_SIZES_ENV, raising=False)
    onnx_path, config = fused
    pool = RegionPool(OrtFusedRunner(onnx_path, config, CAPACITY, 8), 4)
    passes = pool.packed()
    assert passes.sizes == [2, 4] and len(set(map(id, passes.sessions))) == 2
    used = []
    for p in passes.passes:
        real = p.run
        monkeypatch.setattr(p, "run", lambda calls, real=real, n=p.n: used.append(n) or real(calls))
    rng = np.random.default_rng(1)
    ids = [rng.integers(0, config.vocab_size, n) for n in (5, 3)]
    small = [o.copy() for o in passes.run([(b, x, 0, (0, x.size)) for b, x in enumerate(ids)])]
    large = passes.passes[-1].run([(b, x, 0, (0, x.size)) for b, x in enumerate(ids)])  # rewrites the same rows
    assert used == [2, 4]
    for a, b in zip(small, large):
        np.testing.assert_array_equal(a, b)
    passes.run([(3, ids[0], 0, (0, 1))])  # region 3 needs the 4-slot graph
    assert used[-1] == 4
