"""The fused draft head compiled and run (#52): the target graphs' `hidden_layers` output, the head graph's
`layer_features` input, the runners joining / splitting them, and greedy output equal to plain.

One tiny fused head (random, away from its identity start so that every input matters) on the session's 2-layer
Llama target, reading layers (0, 1): layer 1 is the last block, whose output the fused graph takes from the final
norm's sum, layer 0 from the next block's input norm (compiler/feature_layers.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import fp32_decoder as _decoder, random_fused_head

LAYERS = (0, 1)
PROMPTS = ("def main(argv):\n    ", "import os\nimport json\n\n\nclass Config:\n")


@pytest.fixture(scope="module")
def fused_head_dir(workdir, llama_target):
    from specrt.models.draft_head_fused import save_fused_head

    head = random_fused_head(_decoder(llama_target), LAYERS)
    save_fused_head(head, workdir / "fused_head" / "head")
    return workdir / "fused_head" / "head"


@pytest.fixture(scope="module")
def fused_bundle(workdir, llama_target, fused_head_dir):
    from specrt.compiler import CompileSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "fused_head" / "bundle", f"head:{fused_head_dir}",
                                      max_seq_len=128, max_draft_tokens=6))


@pytest.fixture(scope="module")
def head_module(llama_target, fused_head_dir):
    from specrt.models.draft_head_fused import load_fused_head

    return load_fused_head(fused_head_dir, _decoder(llama_target))


def _target_rows(llama_target, ids):
    """The PyTorch decoder's (final features [T, D], block outputs at LAYERS [T, n, D]) over `ids`."""
    from specrt.models.base import empty_past
    from specrt.models.draft_head_fused import layer_taps

    dec = _decoder(llama_target)
    got, handles = layer_taps(dec, LAYERS)
    t = torch.as_tensor(ids)[None]
    with torch.no_grad():
        out = dec(t, torch.arange(t.shape[1])[None], *empty_past(dec.config))
    for h in handles:
        h.remove()
    return out.hidden_states[0].numpy(), torch.stack(got, dim=2)[0].numpy()


def test_manifest_records_the_layers_and_validations(fused_bundle):
    from specrt.bundle.manifest import read_manifest

    m = read_manifest(fused_bundle)
    assert m.draft_head.feature_layers == LAYERS
    assert [t.name for t in m.draft_head.inputs][:2] == ["features", "layer_features"]
    target = m.models["target"]
    assert target.validation["hidden_layers"]["max_abs_diff"] < 1e-4
    assert target.graphs["fused"].validation["hidden_layers"]["max_abs_diff"] < 1e-4
    assert m.draft_head.validation["max_abs_diff"] < 1e-4


@pytest.mark.parametrize("backend", ["ort", "ort-portable"])
def test_target_runner_hands_the_layers_next_to_the_final_feature(fused_bundle, llama_target, backend):
    """hidden_states [S, 3D] = [final ; layer 0 ; layer 1] of the PyTorch decoder, after a prefill and a verify-
    shaped call (the layers the head reads come from the graph, not from anywhere else)."""
    from specrt.runtime import load

    gen = load(fused_bundle, backend=backend)
    ids = np.array(gen.tokenizer.encode(PROMPTS[1]), dtype=np.int64)
    final, layers = _target_rows(llama_target, ids)
    d = final.shape[1]
    r = gen.target
    assert r.hidden_layers == 2
    r.reset()
    r.prefill(ids[:-3], 256)
    first = r.hidden_states.copy()
    r.forward(ids[-3:])
    got = np.concatenate([first, r.hidden_states])
    assert got.shape == (ids.size, 3 * d)
    np.testing.assert_allclose(got[:, :d], final, atol=1e-4)
    np.testing.assert_allclose(got[:, d:].reshape(-1, 2, d), layers, atol=1e-4)
    gen.close()


def test_bundle_without_a_fused_head_has_no_extra_output(target_only_bundle, workdir, llama_target):
    """Other bundles' graphs are unchanged: no `hidden_layers` output in a bundle without a head, and a plain
    (version 1) head asks the target export for no layers."""
    import onnx

    from specrt.compiler import CompileSpec
    from specrt.compiler.preflight import preflight
    from specrt.models.draft_head import DraftHead, save_head
    from specrt.runtime import load

    for name in ("model.onnx", "model.fused.onnx"):
        graph = onnx.load(str(target_only_bundle / "target" / name), load_external_data=False).graph
        assert "hidden_layers" not in [o.name for o in graph.output], name
    gen = load(target_only_bundle, backend="ort")
    assert gen.target.hidden_layers == 0
    gen.close()
    dec = _decoder(llama_target)
    save_head(DraftHead(dec, torch.arange(dec.config.vocab_size)), workdir / "plain_head")
    plan = preflight(CompileSpec(llama_target, workdir / "plain_head_bundle", f"head:{workdir / 'plain_head'}"))
    assert plan.feature_layers == ()


def test_proposer_feeds_what_training_fed(fused_bundle, llama_target, head_module):
    """The head's first call reads the target's features and layers of the prompt's rows, its draft rows its own
    feature with zero layers (recipes/head_ttt.py): the runtime's head logits equal the PyTorch module's on exactly
    those inputs."""
    from specrt.runtime import load

    gen = load(fused_bundle, backend="ort")
    proposer = gen.make_proposer("head", _greedy(), np.random.default_rng(0), {})
    calls, run = [], proposer.runner._run

    def spy(features, token_ids, position, p):  # each graph call: what it was fed and the logits it gave
        logits, hidden = run(features, token_ids, position, p)
        calls.append((features.copy(), logits.copy()))
        return logits, hidden

    proposer.runner._run = spy
    ids = np.array(gen.tokenizer.encode(PROMPTS[0]), dtype=np.int64)
    tokens = np.zeros(64, dtype=np.int64)
    tokens[:ids.size] = ids
    gen.target.reset()
    first = int(gen.target.prefill(ids, 256).argmax())
    tokens[ids.size] = first
    n = ids.size + 1
    proposer.start(tokens, n, gen.target.hidden_states)
    draft = proposer.propose(tokens, n, 3).token_ids
    final, layers = _target_rows(llama_target, tokens[:n])
    d = final.shape[1]
    with torch.no_grad():  # the first call: rows 0..n-2, tokens 1..n-1, the target's layers
        c = head_module.config
        empty = torch.zeros(1, 0, c.num_kv_heads, c.head_dim)
        ref, h, k, v = head_module(torch.from_numpy(final[None, :n - 1]), torch.from_numpy(tokens[None, 1:n]),
                                   torch.arange(n - 1)[None], empty, empty, torch.from_numpy(layers[None, :n - 1]))
        assert calls[0][0].shape == (n - 1, 3 * d)
        np.testing.assert_allclose(calls[0][1], ref[0].numpy(), atol=1e-4)
        # the second call: the head's own feature, zero layers (what training's depth 1 reads)
        ref2, h2, k2, v2 = head_module(h[:, -1:], torch.tensor([[draft[0]]]), torch.tensor([[n - 1]]), k, v, None)
        # the third: its second own feature, over the committed rows and the first draft row (training's depth 2)
        ref3, *_ = head_module(h2, torch.tensor([[draft[1]]]), torch.tensor([[n]]), torch.cat((k, k2), 1),
                               torch.cat((v, v2), 1), None)
    assert calls[1][0].shape == (1, d) and calls[2][0].shape == (1, d)
    np.testing.assert_allclose(calls[1][1], ref2[0].numpy(), atol=1e-4)
    np.testing.assert_allclose(calls[2][1], ref3[0].numpy(), atol=1e-4)
    gen.close()


def _greedy():
    from specrt.runtime.sampling import SamplingParams

    return SamplingParams(temperature=0.0)


@pytest.mark.parametrize("backend", ["ort", "ort-portable"])
def test_greedy_head_and_auto_equal_plain(fused_bundle, backend):
    from specrt.runtime import load

    gen = load(fused_bundle, backend=backend)
    for prompt in PROMPTS:
        plain = gen.generate(prompt, 40, method="none")
        for method, k in (("head", 1), ("head", 3), ("hybrid-head", 2), ("auto", "auto")):
            spec = gen.generate(prompt, 40, method=method, num_speculative_tokens=k)
            assert spec.token_ids == plain.token_ids, (method, k)
            assert spec.stats.drafted_tokens > 0, (method, k)
    gen.close()


def test_int8_head_graph_drafts_like_the_module(fused_head_dir, head_module, llama_target, tmp_path):
    """The fused head's int8 graph (MatMulNBits, as `--draft-quantize int8` / a quantized bundle makes it) passes the
    quantized-head validation on the target's real features and layers."""
    import onnx

    from specrt.compiler.draft_head import export_head
    from specrt.compiler.draft_head_quantize import quantize_head, target_rows, validate_quantized_head
    from specrt.compiler.quantize import QuantizeConfig

    fp32 = export_head(head_module, tmp_path / "head.onnx")
    record = quantize_head(fp32, tmp_path / "head.int8.onnx", QuantizeConfig("int8"))
    ops = [n.op_type for n in onnx.load(str(tmp_path / "head.int8.onnx"), load_external_data=False).graph.node]
    assert ops.count("MatMulNBits") >= 8 and record["type"] == "int8"
    ids = np.arange(3, 3 + 60) % head_module.config.vocab_size
    feats, tokens, layers = target_rows(_decoder(llama_target), ids, LAYERS)
    assert layers.shape == (59, 2, head_module.config.hidden_size)
    got = validate_quantized_head(head_module, tmp_path / "head.int8.onnx", feats, tokens, layers)
    assert got["top1_agreement"] > 0.9 and got["logits_cosine"] > 0.99


def test_auto_stops_drafting_a_weak_head(fused_bundle):
    """A random head: drafted while its prior lasts, then its estimates fall and a request makes no head call."""
    from specrt.runtime import load
    from specrt.runtime.proposers.auto import PRIORS, state_for
    from specrt.runtime.tree_budget import fixed_costs

    gen = load(fused_bundle, backend="ort")
    # seeded sampling's fixed pass costs: whether the head pays depends on its estimates, not on this machine's load
    state_for(gen).costs = fixed_costs(gen.max_draft_tokens + 1)
    calls = []
    for i in range(6):
        prompt = PROMPTS[i % 2] + "x" * i
        plain = gen.generate(prompt, 60, method="none")
        spec = gen.generate(prompt, 60, method="auto")
        assert spec.token_ids == plain.token_ids
        calls.append(spec.stats.draft_calls)
    assert calls[0] > 0 and min(calls[1:]) == 0, calls
    assert state_for(gen).stats.prob(("head", 1, 0)) < PRIORS["head"][0][0]
    gen.close()


def test_fused_head_with_tensorrt_engines_is_refused_in_one_line(fused_head_dir, llama_target, workdir):
    """The TensorRT runners do not bind the target's layers: compile refuses before any export."""
    from specrt.compiler import CompileSpec
    from specrt.compiler.preflight import preflight
    from specrt.compiler.spec import EngineSpec
    from specrt.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="fused draft head.*without --engines trt"):
        preflight(CompileSpec(llama_target, workdir / "fused_trt", f"head:{fused_head_dir}",
                              engines=EngineSpec(kind="trt")))
    assert preflight(CompileSpec(llama_target, workdir / "fused_ort", f"head:{fused_head_dir}")).feature_layers == LAYERS


def test_fused_head_on_the_torch_backend_is_refused(fused_bundle):
    """A backend whose runner does not hand over the layers: `--method head` is one clear error, `auto` runs
    without the head (output still equals plain)."""
    from specrt.core.errors import InvalidArgument
    from specrt.runtime import load

    gen = load(fused_bundle, backend="torch")
    with pytest.raises(InvalidArgument, match="runs with backend 'ort' or 'ort-portable', not 'torch'"):
        gen.generate(PROMPTS[0], 8, method="head")
    assert gen.generate(PROMPTS[0], 16, method="auto").token_ids == gen.generate(PROMPTS[0], 16, method="none").token_ids
    gen.close()
