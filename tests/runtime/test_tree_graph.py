"""Token trees verified in one pass (docs/trees.md): every node's logits equal those of its root-to-node path run
as a plain chain, on the fused graph of every architecture that has one (Gemma 2: beside soft-capped scores; SmolLM3: a layer without rope) and on the PyTorch reference; the KV rows
of an accepted path, compacted, continue exactly like a plain sequence."""

import numpy as np
import pytest

from helpers import make_checkpoint

from specrt.compiler.fused_graph import fused_onnx_from_decoder
from specrt.models.checkpoint import open_checkpoint
from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
from specrt.runtime.tree import ancestor_mask, depths

CAPACITY = 64


def random_tree(rng, nodes: int) -> np.ndarray:
    parents = np.empty(nodes, dtype=np.int64)
    for i in range(nodes):
        parents[i] = rng.integers(-1, i) if i else -1
    return parents


def path_of(parents: np.ndarray, row: int) -> list[int]:
    """Rows root..row (row 0 the root)."""
    rows = [row]
    while rows[-1]:
        rows.append(int(parents[rows[-1] - 1]) + 1)
    return rows[::-1]


@pytest.fixture(scope="module", params=("llama", "qwen3", "gemma3", "gemma2", "smollm3"))
def fused(request, workdir, tokenizer_path):
    layers = 4 if request.param == "smollm3" else 2  # SmolLM3's 4th layer has no rope
    ckpt = make_checkpoint(workdir / "tree" / request.param, request.param, tokenizer_path, layers=layers, seed=3)
    decoder = open_checkpoint(ckpt).load_decoder()
    path = fused_onnx_from_decoder(decoder, workdir / "tree" / f"{request.param}.onnx", CAPACITY)
    return decoder, path


def runner_of(decoder, path) -> OrtFusedRunner:
    return OrtFusedRunner(path, decoder.config, CAPACITY, max_short_tokens=16, threads=1)


def check_tree_against_chains(runner, prompt, tokens, parents, tol=1e-4):
    runner.reset()
    runner.prefill(prompt)
    past = runner.length
    got = runner.forward(tokens, parents).copy()
    for row in range(tokens.size):
        rows = path_of(parents, row)
        runner.truncate(past)
        chain = runner.forward(tokens[rows])[-1]
        assert np.abs(got[row] - chain).max() <= tol, (row, rows, np.abs(got[row] - chain).max())
    runner.truncate(past)


def test_fused_tree_logits_equal_each_path_as_a_chain(fused):
    decoder, path = fused
    runner = runner_of(decoder, path)
    assert runner.supports_tree
    rng = np.random.default_rng(0)
    v = decoder.config.vocab_size
    # past lengths on both sides of Gemma 3's window (6), several random trees
    for past, nodes in ((3, 5), (12, 5), (20, 5), (9, 3)):
        prompt = rng.integers(0, v, past).astype(np.int64)
        parents = random_tree(rng, nodes)
        tokens = rng.integers(0, v, nodes + 1).astype(np.int64)
        check_tree_against_chains(runner, prompt, tokens, parents)


def test_compacted_path_continues_like_a_plain_sequence(fused):
    decoder, path = fused
    runner = runner_of(decoder, path)
    rng = np.random.default_rng(1)
    v = decoder.config.vocab_size
    prompt = rng.integers(0, v, 10).astype(np.int64)
    parents = np.array([-1, -1, 1, 0, 2], dtype=np.int64)  # rows 1, 2 children of the root; 3 <- 2; 4 <- 1; 5 <- 3
    tokens = rng.integers(0, v, parents.size + 1).astype(np.int64)
    accepted = path_of(parents, 5)  # rows 0, 2, 3, 5
    nxt = rng.integers(0, v, 3).astype(np.int64)
    runner.prefill(prompt)
    past = runner.length
    runner.forward(tokens, parents)
    runner.keep_path(past, accepted[1:])
    runner.truncate(past + len(accepted))
    got = runner.forward(nxt).copy()
    runner.reset()
    runner.prefill(prompt)
    runner.forward(tokens[accepted])
    expected = runner.forward(nxt)
    assert np.abs(got - expected).max() <= 1e-4


def test_default_is_the_chain_and_masks_are_ancestors():
    parents = np.array([-1, 0, 0, -1, 3])
    mask = ancestor_mask(parents)
    assert mask.tolist()[3] == [True, True, False, True, False, False]
    assert depths(parents).tolist() == [0, 1, 2, 2, 1, 2]


@pytest.fixture(scope="module")
def portable(target_only_bundle, llama_target):
    """The session's toy bundle (compiled once): its cleaned portable graph has the tree input."""
    return open_checkpoint(llama_target).load_decoder(), target_only_bundle / "target" / "model.onnx"


@pytest.mark.parametrize("backend", ("ort-portable", "torch"))
def test_portable_and_torch_tree_logits_equal_each_path_as_a_chain(portable, backend):
    from specrt.runtime.backends.ort.runner import OrtRunner
    from specrt.runtime.backends.pytorch.runner import TorchRunner

    decoder, path = portable
    if backend == "torch":
        runner = TorchRunner(path, decoder.config, CAPACITY, threads=1)
    else:
        runner = OrtRunner(path, decoder.config, CAPACITY, max_short_tokens=16, threads=1)
    assert runner.supports_tree
    rng = np.random.default_rng(2)
    v = decoder.config.vocab_size
    for past, nodes in ((4, 6), (15, 9), (30, 3)):
        prompt = rng.integers(0, v, past).astype(np.int64)
        check_tree_against_chains(runner, prompt, rng.integers(0, v, nodes + 1).astype(np.int64),
                                  random_tree(rng, nodes))


def test_two_row_targets_verify_chains_unless_asked(fused, monkeypatch):
    """A level-4 int4 target (min_rows 2) turns a tree row's ~1e-8 attention rounding into logits off by ~0.5
    (docs/trees.md): its runner reports no tree support, so the loop verifies first chains; an explicit opt-in."""
    decoder, path = fused
    assert not OrtFusedRunner(path, decoder.config, CAPACITY, 16, threads=1, min_rows=2).supports_tree
    monkeypatch.setenv("SPECRT_TREES_INEXACT", "1")
    assert OrtFusedRunner(path, decoder.config, CAPACITY, 16, threads=1, min_rows=2).supports_tree


@pytest.mark.parametrize("head_major", (False, True))
def test_compact_moves_only_the_path_rows(head_major):
    from specrt.runtime.backends.ort.fused_runner import HeadMajorKVCache
    from specrt.runtime.kv_cache import KVCache

    cache = (HeadMajorKVCache(2, 16, 3, 4) if head_major else
             KVCache(2, 16, 3, 4, lambda shape: np.zeros(shape, np.float32)))
    axis = cache.seq_axis
    for buf in (*cache.keys, *cache.values):
        np.moveaxis(buf, axis, 0)[:] = np.arange(16, dtype=np.float32)[:, None, None, None]  # row r holds r
    cache.length = 12
    cache.compact(6, [6, 8, 11])  # root row 6 stays; rows 8, 11 -> 7, 8
    for buf in (*cache.keys, *cache.values):
        rows = np.moveaxis(buf, axis, 0)[:, 0, 0, 0]
        assert rows.tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 11, 9, 10, 11, 12, 13, 14, 15]
    with pytest.raises(ValueError, match="cannot move down"):
        cache.compact(6, [5])


def test_torch_decoder_tree_rows_equal_their_paths_across_the_window(fused):
    """The reference decoders (what the portable graph is exported from) on trees, Gemma 3's window included."""
    import torch

    decoder, _ = fused
    c = decoder.config
    rng = np.random.default_rng(5)
    parents = np.array([-1, 0, -1, 2, 1], np.int64)
    past_len, s = 9, parents.size + 1
    gen = torch.Generator().manual_seed(5)  # not the process-wide generator, which earlier tests in this worker moved
    past = [torch.randn(1, past_len, c.num_kv_heads, c.head_dim, generator=gen) for _ in range(2 * c.num_layers)]
    ids = torch.from_numpy(rng.integers(0, c.vocab_size, s))[None]
    with torch.no_grad():
        got = decoder(ids, torch.from_numpy(past_len + depths(parents))[None], past[0::2], past[1::2],
                      tree_mask=torch.from_numpy(ancestor_mask(parents))).logits[0]
        for row in range(s):
            rows = path_of(parents, row)
            chain = decoder(ids[:, rows], torch.arange(past_len, past_len + len(rows))[None], past[0::2],
                            past[1::2]).logits[0, -1]
            assert (got[row] - chain).abs().max() <= 1e-4, row
