"""The ragged graph (runtime/backends/ort/ragged_graph.py: one GroupQueryAttention per layer over right-padded
chunks, `query_seqlens`) of every fused architecture: Llama (packed QKV), Qwen3 (q/k norms: separate q, k, v
inputs), Gemma 3 (sliding-window layers, two rope caches). One ragged pass over several sequences gives each the
logits and KV rows of its own call alone, bit for bit, on real ONNX Runtime sessions: prefill chunks, one-token
decodes and verify passes in one pass, pasts that cross Gemma 3's window, calls padded to two attention rows (a
target whose calls alone have two rows), and a region in the batch without rows keeps its KV untouched."""

import numpy as np
import pytest

from helpers import GEMMA3_WINDOW, make_checkpoint

from specrt.compiler.fused_graph import fused_onnx_from_decoder
from specrt.models.checkpoint import open_checkpoint
from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
from specrt.runtime.backends.ort.ragged_graph import ragged_supported
from specrt.runtime.backends.ort.runner import import_ort
from specrt.runtime.batch.pool import RegionPool
from specrt.runtime.batch.ragged import RAGGED_ENV, RaggedPass

CAPACITY = 48

pytestmark = pytest.mark.skipif(not ragged_supported(import_ort()),
                                reason="needs onnxruntime >= 1.32 (GroupQueryAttention's query_seqlens input)")


@pytest.fixture(scope="module", params=("llama", "qwen3", "gemma3"))
def fused(request, workdir, tokenizer_path):
    path = make_checkpoint(workdir / "ragged" / request.param, request.param, tokenizer_path, layers=2, seed=5)
    decoder = open_checkpoint(path).load_decoder()
    onnx_path = fused_onnx_from_decoder(decoder, workdir / "ragged" / f"{request.param}.fused.onnx", CAPACITY)
    return onnx_path, decoder.config


@pytest.mark.parametrize("min_rows", [1, 2])
def test_ragged_pass_equals_each_call_alone(fused, min_rows):
    onnx_path, config = fused
    alone = OrtFusedRunner(onnx_path, config, CAPACITY, 8, min_rows=min_rows)
    pool = RegionPool(OrtFusedRunner(onnx_path, config, CAPACITY, 8, min_rows=min_rows), 4)
    ragged = RaggedPass(pool)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, config.vocab_size, n) for n in (9, 2 * GEMMA3_WINDOW + 3, 4, 5)]
    runners = [pool.acquire() for _ in range(4)]
    history = [[] for _ in range(4)]  # every call each region made, for the reference runs

    def run(step):  # step: {region: ids}; regions not in it keep their KV
        calls = [(b, ids, runners[b].length, (0, ids.size), min_rows) for b, ids in step.items()]
        untouched = {b: (pool.keys[0][b].copy(), pool.values[1][b].copy()) for b in range(4) if b not in step}
        got = [o.copy() for o in ragged.run(calls)]
        for b, ids in step.items():
            runners[b].cache.length += ids.size
        for b, (k, v) in untouched.items():
            np.testing.assert_array_equal(pool.keys[0][b], k)
            np.testing.assert_array_equal(pool.values[1][b], v)
        for (b, ids, _, _, _), logits in zip(calls, got):
            alone.reset()
            for prev in history[b]:
                alone.forward(prev)
            np.testing.assert_array_equal(logits, alone.forward(ids), err_msg=f"{config.architecture} region {b}")
            n = alone.length
            for i in range(config.num_layers):  # the KV rows the call wrote, as alone
                np.testing.assert_array_equal(pool.keys[i][b, :, :n], alone.cache.keys[i][0, :, :n])
                np.testing.assert_array_equal(pool.values[i][b, :, :n], alone.cache.values[i][0, :, :n])
            history[b].append(ids)

    run({0: prompts[0], 1: prompts[1][:7], 3: prompts[3]})  # region 2 in the batch without rows
    run({1: prompts[1][7:], 2: prompts[2], 0: np.array([5])})  # prefill with a past, prefill, one-token decode
    run({0: np.array([6, 7, 8]), 1: np.array([9]), 2: np.array([1, 2]), 3: np.array([3, 4, 5, 6])})  # verify passes
    run({1: np.array([4]), 3: np.array([8])})  # one-token decodes only; regions 0 and 2 idle
    assert runners[1].length > GEMMA3_WINDOW * 2


def test_one_attention_node_per_layer(fused):
    from specrt.runtime.backends.ort.ragged_graph import ragged_model

    onnx_path, config = fused
    model = ragged_model(onnx_path)
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(nodes) == config.num_layers
    assert all(n.input[16] == "ragged_query_seqlens" for n in nodes)


def test_pool_uses_the_ragged_pass_for_two_row_targets_unless_disabled(fused, monkeypatch):
    from specrt.runtime.batch.packed import PackedPasses

    onnx_path, config = fused

    def pool(min_rows):
        return RegionPool(OrtFusedRunner(onnx_path, config, CAPACITY, 8, min_rows=min_rows), 2)

    monkeypatch.delenv(RAGGED_ENV, raising=False)
    assert isinstance(pool(2).packed(), RaggedPass)  # a two-row target: every call counts two rows or more
    assert isinstance(pool(1).packed(), PackedPasses)  # one-token calls beside longer ones: one pass, not two
    monkeypatch.setenv(RAGGED_ENV, "0")
    assert isinstance(pool(2).packed(), PackedPasses)


def test_bad_calls_are_refused(fused):
    from specrt.core.errors import InvalidArgument

    onnx_path, config = fused
    pool = RegionPool(OrtFusedRunner(onnx_path, config, CAPACITY, 8), 2)
    ragged = RaggedPass(pool)
    with pytest.raises(InvalidArgument, match="out of range"):
        ragged.run([(2, np.array([1]), 0, (0, 1))])
    with pytest.raises(InvalidArgument, match="given twice"):
        ragged.run([(0, np.array([1]), 0, (0, 1)), (0, np.array([2]), 1, (0, 1))])
    with pytest.raises(InvalidArgument, match="capacity"):
        ragged.run([(0, np.array([1, 2]), CAPACITY - 1, (0, 1))])


def test_two_row_target_at_the_cache_capacity(fused):
    """A two-row target's one-token call at the last cache position runs unpadded alone (no room for the second
    row), so beside a longer call it takes a one-row pass of its own; a call whose past + the chunk's rows would
    pass the capacity takes a shorter pass: each still its call alone."""
    onnx_path, config = fused
    alone = OrtFusedRunner(onnx_path, config, CAPACITY, 8, min_rows=2)
    pool = RegionPool(OrtFusedRunner(onnx_path, config, CAPACITY, 8, min_rows=2), 3)
    ragged = RaggedPass(pool)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, config.vocab_size, n) for n in (CAPACITY - 1, 6, CAPACITY - 3)]
    runners = [pool.acquire() for _ in range(3)]
    for r, p in zip(runners, prompts):
        r.forward(p)
    step = [np.array([11]), np.array([1, 2, 3, 4, 5]), np.array([7, 8])]
    got = [o.copy() for o in ragged.run([(b, ids, runners[b].length, (0, ids.size), 2) for b, ids in enumerate(step)])]
    for b, (p, ids) in enumerate(zip(prompts, step)):
        alone.reset()
        alone.forward(p)
        np.testing.assert_array_equal(got[b], alone.forward(ids), err_msg=f"region {b}")
