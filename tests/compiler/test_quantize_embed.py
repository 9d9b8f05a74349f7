"""The token embedding of quantized fused graphs (compiler/quantize_embed.py): GatherBlockQuantized runs in ONNX
Runtime with a batch dimension and matches the fp32 table within the block quantization error (exactly the
dequantized table); a tied head and the embedding share one packed int4 initializer; a compiled tied int4 bundle
stores no fp32 table."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.compiler.quantize import QuantizeConfig
from specrt.compiler.quantize_embed import dequantize, embedding_table, quantize_embedding
from specrt.compiler.quantize_fused import quantize_fused_onnx

V, H = 96, 64


def _session(model):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _graph(table: np.ndarray, tied_head: bool):
    """input_ids [B, S] -> embed_tokens Gather -> `embedded`; with `tied_head`, the embedded rows also go through
    lm_head = Gemm(rows, table, transB=1), the fused graph's tied form."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Gather", ["embed_tokens.weight", "input_ids"], ["embedded"], name="embed_tokens")]
    outputs = [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, ["B", "S", H])]
    inits = [numpy_helper.from_array(table, "embed_tokens.weight")]
    if tied_head:
        inits.append(numpy_helper.from_array(np.array([-1, H], np.int64), "rows_shape"))
        nodes += [helper.make_node("Reshape", ["embedded", "rows_shape"], ["rows"], name="rows"),
                  helper.make_node("Gemm", ["rows", "embed_tokens.weight"], ["logits"], transB=1, name="lm_head")]
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["R", V]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _within_block_error(got: np.ndarray, ref: np.ndarray, bits: int) -> bool:
    """|got - ref| within one quantization step of each 32-wide block (step: max |x| / 2^(bits-1); half a step of
    rounding, a whole one where the value opposite the block's extreme is clamped to 2^(bits-1) - 1)."""
    blocks = ref.reshape(*ref.shape[:-1], -1, 32)
    step = np.abs(blocks).max(axis=-1, keepdims=True) / (1 << (bits - 1))
    return bool((np.abs(got.reshape(blocks.shape) - blocks) <= step * (1 + 1e-5) + 1e-6).all())


@pytest.mark.parametrize("bits", [4, 8])
def test_gather_block_quantized_matches_the_fp32_table(bits):
    table = np.random.default_rng(0).normal(size=(V, H)).astype(np.float32)
    model = _graph(table, tied_head=False)
    record = quantize_embedding(model, tied=False, bits=bits, block_size=32, symmetric=True)
    assert record == {"storage": "GatherBlockQuantized", "shared_with": None}
    assert not any(tuple(t.dims) == (V, H) and t.data_type == 1 for t in model.graph.initializer)  # no fp32 table
    ids = np.array([[0, 5, V - 1], [7, 7, 1]], np.int64)  # batch of 2
    got = _session(model).run(None, {"input_ids": ids})[0]
    assert got.shape == (2, 3, H)
    assert _within_block_error(got, table[ids], bits)
    assert np.abs(got - table[ids]).max() > 0  # it is quantized
    np.testing.assert_array_equal(got, embedding_table(model)[ids])  # the portable graph's table, exactly


def test_tied_head_and_embedding_share_one_packed_initializer(tmp_path):
    import onnx

    table = np.random.default_rng(1).normal(size=(V, H)).astype(np.float32)
    onnx.save(_graph(table, tied_head=True), str(tmp_path / "fp32.onnx"))
    counts = quantize_fused_onnx(tmp_path / "fp32.onnx", tmp_path / "q4.onnx", QuantizeConfig("int4", accuracy_level=1))
    assert counts["extra"]["embedding"] == {"storage": "GatherBlockQuantized", "shared_with": "lm_head"}
    model = onnx.load(str(tmp_path / "q4.onnx"))
    nodes = {n.op_type: n for n in model.graph.node}
    reshape = next(n for n in model.graph.node if nodes["GatherBlockQuantized"].input[0] in n.output)
    assert reshape.input[0] == nodes["MatMulNBits"].input[1]  # the head's packed weights, stored once
    assert nodes["GatherBlockQuantized"].input[2] == nodes["MatMulNBits"].input[2]  # and its scales
    big = [t for t in model.graph.initializer if V in t.dims]
    assert sorted(t.data_type for t in big) == [1, 2]  # one uint8 matrix and its fp32 scales, no fp32 table
    ids = np.array([[3, 1, 4], [1, 5, 9]], np.int64)
    embedded, logits = _session(model).run(None, {"input_ids": ids})
    assert _within_block_error(embedded, table[ids], 4)
    q_table = embedding_table(model)
    np.testing.assert_array_equal(embedded, q_table[ids])
    # the head computes with the same quantized matrix
    np.testing.assert_allclose(logits, embedded.reshape(-1, H) @ q_table.T, rtol=1e-4, atol=1e-3)


def test_dequantize_reads_low_nibble_first():
    packed = np.array([[[0x9F]]], np.uint8)  # low 0xF -> 15 - 8 = 7, high 0x9 -> 9 - 8 = 1
    np.testing.assert_array_equal(dequantize(packed, np.array([[2.0]], np.float32), 4, 2), [[14.0, 2.0]])


def test_lean_int4_bundle_stores_its_embedding_quantized(lean_int4_bundle):
    import onnx

    from specrt.bundle.manifest import read_manifest

    m = read_manifest(lean_int4_bundle)
    fused = m.models["target"].quantization.graphs["fused"]
    assert fused.extra["embedding"]["storage"] == "GatherBlockQuantized"
    model = onnx.load(str(m.path(fused.onnx)), load_external_data=False)
    vocab, hidden = m.models["target"].decoder_config.vocab_size, m.models["target"].decoder_config.hidden_size
    assert not any(t.data_type == 1 and tuple(t.dims) == (vocab, hidden) for t in model.graph.initializer)
    assert not any(rel.startswith("draft/") for rel in m.files)  # the self:int4 draft adds no file


@pytest.mark.slow
def test_tied_int4_bundle_stores_the_matrix_once(workdir, tokenizer_path, tmp_path):
    """A tied model compiled with --quantize int4: one packed [vocab, ...] matrix, no fp32 table, and the graph
    file is about the size of its quantized weights."""
    import onnx

    from helpers import make_checkpoint
    from specrt.bundle.manifest import read_manifest
    from specrt.compiler import CompileSpec, QuantizeSpec, compile_bundle
    from specrt.runtime.generator import load

    ckpt = make_checkpoint(tmp_path / "tied", "llama_tied_llama3", tokenizer_path, layers=2)
    bundle = compile_bundle(CompileSpec(ckpt, tmp_path / "b", "self:int4", max_seq_len=64, max_draft_tokens=4,
                                        quantize=QuantizeSpec("int4")))
    m = read_manifest(bundle)
    fused = m.models["target"].quantization.graphs["fused"]
    assert fused.extra["embedding"] == {"storage": "GatherBlockQuantized", "shared_with": "lm_head"}
    model = onnx.load(str(m.path(fused.onnx)), load_external_data=False)
    c = m.models["target"].decoder_config
    vocab_rows = [t for t in model.graph.initializer if t.dims and t.dims[0] == c.vocab_size]
    assert sorted(t.data_type for t in vocab_rows) == [1, 2]  # packed uint8 + fp32 scales
    quantized_bytes = sum(int(np.prod(t.dims)) * (1 if t.data_type == 2 else 4) for t in model.graph.initializer
                          if t.data_location == onnx.TensorProto.EXTERNAL)
    assert m.files[fused.onnx_data].size <= quantized_bytes + 4096  # nothing else stored (alignment aside)
    assert m.files[fused.onnx_data].size < c.vocab_size * c.hidden_size * 4  # smaller than the fp32 table alone
    gen = load(bundle, backend="ort")
    ref = gen.generate("def main(args):", 12, method="none", temperature=0)
    got = gen.generate("def main(args):", 12, method="draft", temperature=0, num_speculative_tokens=3)
    assert got.token_ids == ref.token_ids
