"""The fused ONNX Runtime graph variant: the GroupQueryAttention contract it relies on, its structure,
validation catching a broken graph, the bundle's graph variants, and prefill's last-row logits."""

import json
import shutil

import numpy as np
import pytest
import torch

from specrt.bundle.manifest import read_manifest
from specrt.models.checkpoint import open_checkpoint
from specrt.compiler import CompileSpec, compile_bundle
from specrt.compiler.fused_graph import build_fused_model, fused_onnx_from_decoder
from specrt.compiler.fused_validate import validate_fused_onnx
from specrt.compiler.validate import ValidationError, validation_shapes


def _gqa_model(hq, hkv, d, capacity):
    from onnx import TensorProto as T, helper as h, numpy_helper

    freqs = np.arange(capacity)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
    inputs = [h.make_tensor_value_info("q", T.FLOAT, [1, "S", hq * d]),
              h.make_tensor_value_info("k", T.FLOAT, [1, "S", hkv * d]),
              h.make_tensor_value_info("v", T.FLOAT, [1, "S", hkv * d]),
              h.make_tensor_value_info("past_k", T.FLOAT, [1, hkv, capacity, d]),
              h.make_tensor_value_info("past_v", T.FLOAT, [1, hkv, capacity, d]),
              h.make_tensor_value_info("seqlens_k", T.INT32, [1]),
              h.make_tensor_value_info("total", T.INT32, [])]
    node = h.make_node("GroupQueryAttention", ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total", "cos", "sin"],
                       ["out", "present_k", "present_v"], domain="com.microsoft", num_heads=hq, kv_num_heads=hkv,
                       do_rotary=1)
    outputs = [h.make_tensor_value_info("out", T.FLOAT, [1, "S", hq * d]),
               h.make_tensor_value_info("present_k", T.FLOAT, [1, hkv, capacity, d]),
               h.make_tensor_value_info("present_v", T.FLOAT, [1, hkv, capacity, d])]
    inits = [numpy_helper.from_array(np.cos(freqs).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(freqs).astype(np.float32), "sin")]
    graph = h.make_graph([node], "gqa", inputs, outputs, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)],
                        ir_version=10), np.cos(freqs), np.sin(freqs)


def test_gqa_multi_token_with_past_in_place_and_rollback():
    """What the fused runner relies on, checked on the installed ONNX Runtime: S > 1 new tokens over a past
    (verify, chunked prefill) with one buffer bound as past and present, rotary at absolute positions
    P..P+S-1, and rollback by passing a smaller length (rows beyond it are overwritten, never read)."""
    import onnxruntime as ort

    from specrt.models.layers import attend

    hq, hkv, d, cap = 4, 2, 16, 32
    model, cos, sin = _gqa_model(hq, hkv, d, cap)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    keys, values = np.zeros((1, hkv, cap, d), np.float32), np.zeros((1, hkv, cap, d), np.float32)
    ref_k, ref_v = [], []  # rotated keys / values per position, [Hkv, D] each
    rng = np.random.default_rng(0)

    def rope(x, pos):  # x [S, H, D]
        c = np.concatenate([cos[pos], cos[pos]], -1)[:, None]
        s = np.concatenate([sin[pos], sin[pos]], -1)[:, None]
        return x * c + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * s

    for s, p in ((5, 0), (1, 5), (4, 6), (3, 7), (6, 10)):  # (3, 7) rolls back 3 of the 10 positions
        q, k, v = (rng.standard_normal((1, s, n * d)).astype(np.float32) for n in (hq, hkv, hkv))
        b = sess.io_binding()
        for name, a in (("q", q), ("k", k), ("v", v), ("seqlens_k", np.array([p + s - 1], np.int32)),
                        ("total", np.array(p + s, np.int32))):
            b.bind_cpu_input(name, a)
        for name_in, name_out, buf in (("past_k", "present_k", keys), ("past_v", "present_v", values)):
            b.bind_input(name_in, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
            b.bind_output(name_out, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
        b.bind_output("out", "cpu")
        sess.run_with_iobinding(b)
        out = b.copy_outputs_to_cpu()[-1]
        pos = np.arange(p, p + s)
        qr, kr = rope(q[0].reshape(s, hq, d), pos), rope(k[0].reshape(s, hkv, d), pos)
        f32 = lambda a: torch.tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
        past_k, past_v = (f32(np.array(r[:p]).reshape(1, p, hkv, d)) for r in (ref_k, ref_v))
        expected = attend(f32(qr[None]), past_k, past_v, f32(kr[None]), f32(v.reshape(1, s, hkv, d)),
                          d**-0.5).numpy().reshape(out.shape)
        assert np.allclose(out, expected, atol=1e-5), (s, p)
        del ref_k[p:], ref_v[p:]
        ref_k.extend(kr)
        ref_v.extend(v[0].reshape(s, hkv, d))
        assert np.allclose(keys[0, :, :p + s].transpose(1, 0, 2), np.array(ref_k), atol=1e-5)


@pytest.fixture(scope="module")
def decoder(llama_target):
    return open_checkpoint(llama_target).load_decoder()


def test_fused_graph_structure(decoder):
    """One GQA and fused QKV / gate-up MatMuls per layer, weights read directly by MatMul (no Transpose)."""
    model = build_fused_model(decoder, max_seq_len=64)
    ops = [n.op_type for n in model.graph.node if not n.name.startswith("tree/")]
    tree = [n for n in model.graph.node if n.name.startswith("tree/")]  # once per pass (compiler/fused_tree.py)
    assert 0 < len(tree) < 40
    layers = decoder.config.num_layers
    assert ops.count("GroupQueryAttention") == layers
    assert ops.count("MatMul") == 4 * layers + (0 if decoder.config.tie_word_embeddings else 1)
    assert "Transpose" not in ops and "Cast" not in ops
    assert ops.count("SkipSimplifiedLayerNormalization") == 2 * layers
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer}
    c = decoder.config
    assert inits["layers.0.attn.qkv_proj.weight"] == (c.hidden_size, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim)
    assert inits["layers.0.mlp.gate_up_proj.weight"] == (c.hidden_size, 2 * c.intermediate_size)
    assert len(ops) < 20 * layers


def test_validation_catches_a_broken_fused_graph(decoder, tmp_path):
    import dataclasses

    from specrt.models import build_decoder

    wrong = build_decoder(dataclasses.replace(decoder.config, rope=dataclasses.replace(decoder.config.rope,
                                                                                        theta=500.0)))
    wrong.load_state_dict(decoder.state_dict())
    path = fused_onnx_from_decoder(wrong.eval(), tmp_path / "m.onnx", 64)
    with pytest.raises(ValidationError, match="differs from PyTorch"):
        validate_fused_onnx(decoder, path, validation_shapes(64, 4), capacity=64)
    assert validate_fused_onnx(wrong, path, validation_shapes(64, 4), capacity=64)["max_abs_diff"] < 1e-4


def test_ort_graph_portable_writes_no_fused_variant(tmp_path, llama_target):
    from specrt.runtime import load

    out = compile_bundle(CompileSpec(llama_target, tmp_path / "b", max_seq_len=64, max_draft_tokens=4, ort_graph="portable"))
    entry = read_manifest(out).models["target"]
    assert set(entry.graphs) == {"portable"} and not (out / "target" / "model.fused.onnx").exists()
    assert load(out, backend="ort").target.describe().get("graph") is None


def test_bad_ort_graph_value(tmp_path, llama_target):
    from specrt.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="--ort-graph"):
        compile_bundle(CompileSpec(llama_target, tmp_path / "b", max_seq_len=64, max_draft_tokens=4, ort_graph="fast"))


def test_bundle_without_variants_still_loads(tmp_path, pair_bundle):
    """Bundles written before graph variants existed: `onnx` is the portable graph."""
    from specrt.runtime import load

    b = shutil.copytree(pair_bundle, tmp_path / "b")
    m = json.loads((b / "manifest.json").read_text())
    for entry in m["models"].values():
        del entry["graphs"]
    (b / "manifest.json").write_text(json.dumps(m))
    gen = load(b, backend="ort")
    assert gen.target.describe().get("graph") is None
    assert gen.generate("import os\n", 8, method="none").token_ids == \
        load(pair_bundle, backend="ort").generate("import os\n", 8, method="none").token_ids


@pytest.mark.parametrize("backend", ["ort", "ort-portable"])
def test_prefill_computes_only_the_last_logits_row(pair_bundle, backend):
    """A long prompt's prefill returns the last row computed alone, equal to the all-rows form."""
    from specrt.runtime import load

    gen = load(pair_bundle, backend=backend)
    r = gen.target
    ids = np.random.default_rng(1).integers(0, gen.vocab_size, 100).astype(np.int64)
    expected = r.forward(ids)[-1].copy()
    r.reset()
    got = r.prefill(ids, chunk=25)  # chunks longer than a verify call (a short one reuses the decode bindings)
    assert r.length == 100 and got.shape == (gen.vocab_size,)
    assert np.allclose(got, expected, atol=1e-4, rtol=1e-4)
    if backend == "ort":  # the graph itself produced a single row (not a slice of a full [S, V] result)
        assert r._last_logits[0, 0].ctypes.data == got.ctypes.data
    else:
        assert r._has_logit_start
    after = r.forward(ids[:1]).copy()  # the cache written by the last-row prefill is right
    r.reset()
    assert np.allclose(after, r.forward(np.concatenate([ids, ids[:1]]))[-1:], atol=1e-4, rtol=1e-4)


def test_fused_runner_bindings_follow_every_change_of_call_shape(pair_bundle):
    """The fused runner binds its buffers once per call shape: a sequence that changes shape (decode,
    verify, a rollback, a long call on one-off buffers, last-row prefill) gives the portable runner's logits
    at every call, and a repeated shape reuses the bindings without rebinding."""
    from specrt.runtime import load

    fused, portable = load(pair_bundle, backend="ort").target, load(pair_bundle, backend="ort-portable").target
    assert fused.describe()["graph"] == "fused"
    rng = np.random.default_rng(3)
    ids = rng.integers(0, fused.vocab_size, 120).astype(np.int64)
    calls = [("prefill", 20), ("fwd", 1), ("fwd", 1), ("fwd", 4), ("truncate", 2), ("fwd", 1), ("fwd", 30),
             ("fwd", 1), ("last", 3), ("fwd", 5), ("fwd", 5), ("fwd", 1)]
    pos = 0
    for kind, n in calls:
        if kind == "truncate":
            fused.truncate(fused.length - n)
            portable.truncate(portable.length - n)
            pos -= n
            continue
        chunk = ids[pos:pos + n]
        pos += n
        if kind == "prefill":
            got, want = fused.prefill(chunk, chunk=8), portable.prefill(chunk, chunk=8)
        elif kind == "last":
            got, want = fused.forward_last(chunk), portable.forward_last(chunk)
        else:
            bound_before = fused._bound
            got, want = fused.forward(chunk), portable.forward(chunk)
            if n == 1 and bound_before is not None and bound_before[0] == 1:
                assert fused._bound == bound_before  # same shape: nothing rebound
        assert got.shape == want.shape and np.allclose(got, want, atol=1e-4, rtol=1e-4), (kind, n)
        assert fused.length == portable.length == pos
