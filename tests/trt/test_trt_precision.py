"""fp32 -> fp16 / bf16 ONNX conversion (TensorRT 11 is strongly typed), checked with ONNX Runtime on the CPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specrt.bundle import graph_io
from specrt.compiler.trt.precision import half_array, half_onnx_from_fp32
from specrt.core.errors import InvalidArgument


def _feeds(c, s: int, p: int, dtype, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {graph_io.INPUT_IDS: rng.integers(0, c["vocab_size"], (1, s)).astype(np.int64),
             graph_io.POSITION_IDS: np.arange(p, p + s, dtype=np.int64)[None]}
    for i in range(c["num_layers"]):
        for name in (graph_io.past_key(i), graph_io.past_value(i)):
            feeds[name] = rng.standard_normal((1, p, c["num_kv_heads"], c["head_dim"])).astype(dtype)
    return feeds


def _session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def target(pair_bundle):
    from specrt.bundle.manifest import read_manifest

    m = read_manifest(pair_bundle, verify_checksums=False)
    return m.path(m.models["target"].onnx), dataclasses.asdict(m.models["target"].decoder_config)


def test_fp16_graph_runs_in_ort_and_matches_fp32(target, tmp_path):
    src, c = target
    dst = half_onnx_from_fp32(src, tmp_path / "model.fp16.onnx", "fp16")
    assert (tmp_path / "model.fp16.onnx.data").exists()
    ref_sess, half_sess = _session(src), _session(dst)
    types = {o.name: o.type for o in half_sess.get_outputs()}
    assert types[graph_io.LOGITS] == "tensor(float)"  # logits stay fp32 via a final Cast
    assert types[graph_io.HIDDEN_STATES] == types[graph_io.new_key(0)] == "tensor(float16)"
    assert {i.name: i.type for i in half_sess.get_inputs()}[graph_io.past_key(0)] == "tensor(float16)"
    for s, p in ((7, 0), (9, 60), (1, 100)):  # prefill, verify, decode at a far position (rope kept fp32)
        ref = ref_sess.run([graph_io.LOGITS], _feeds(c, s, p, np.float32))[0]
        got = half_sess.run([graph_io.LOGITS], _feeds(c, s, p, np.float16))[0]
        assert got.dtype == np.float32
        assert np.abs(got - ref).max() < 1e-2, (s, p, np.abs(got - ref).max())


def test_bf16_graph_is_valid_onnx(target, tmp_path):
    import onnx

    src, _ = target
    dst = half_onnx_from_fp32(src, tmp_path / "model.bf16.onnx", "bf16")
    onnx.checker.check_model(str(dst), full_check=True)  # ORT's CPU provider lacks bf16 Pow: check only
    m = onnx.load(str(dst), load_external_data=False)
    kinds = {t.data_type for t in m.graph.initializer}
    assert onnx.TensorProto.BFLOAT16 in kinds
    assert {o.name: o.type.tensor_type.elem_type for o in m.graph.output}[graph_io.LOGITS] == onnx.TensorProto.FLOAT
    cast_to = [a.i for n in m.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    assert onnx.TensorProto.FLOAT in cast_to  # the rotary island and the logits cast


def test_half_array_clips_fp16_and_rounds_bf16():
    a = np.array([np.finfo(np.float32).min, 1.0, 1e6], dtype=np.float32)
    h = half_array(a, "fp16")
    assert h.dtype == np.float16 and np.isfinite(h).all() and h[0] == -65504
    b = half_array(np.array([1.00390625], dtype=np.float32), "bf16")  # halfway: round to even -> 1.0
    assert float(b[0]) == 1.0


def test_unknown_precision(target, tmp_path):
    with pytest.raises(InvalidArgument, match="int8"):
        half_onnx_from_fp32(target[0], tmp_path / "x.onnx", "int8")
