"""The TensorRT ONNX-parser check runs on the CPU: opset range, operator list, data types."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from specrt.compiler.trt.support import MAX_OPSET, onnx_support_report


def test_bundle_graph_is_supported(pair_bundle):
    rep = onnx_support_report(pair_bundle / "target" / "model.onnx")
    assert rep["supported"], rep["problems"]
    assert "MatMul" in rep["op_types"] and rep["opset"] == 18
    assert "onnx-tensorrt" in rep["reference"]


def test_unsupported_graph_lists_every_problem(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [None])
    nodes = [helper.make_node("Unique", ["x"], ["u"]), helper.make_node("MyOp", ["u"], ["y"], domain="com.acme")]
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", MAX_OPSET + 3),
                                                    helper.make_opsetid("com.acme", 1)])
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    rep = onnx_support_report(path)
    assert not rep["supported"]
    text = " | ".join(rep["problems"])
    assert f"opset {MAX_OPSET + 3}" in text and "Unique" in text and "com.acme::MyOp" in text and "DOUBLE" in text
