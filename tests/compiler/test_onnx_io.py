"""save_onnx: every graph as NAME.onnx + NAME.onnx.data, whatever the current directory holds."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.compiler.onnx_io import save_onnx


def tiny_model():
    big = numpy_helper.from_array(np.arange(600, dtype=np.float32).reshape(1, 600), "big")  # 2.4 KB: external
    small = numpy_helper.from_array(np.ones((1, 600), np.float32)[:, :4].copy(), "small")  # 16 B: inline
    nodes = [helper.make_node("Add", ["x", "big"], ["y"]),
             helper.make_node("Slice", ["y", "starts", "ends", "axes"], ["y4"]),
             helper.make_node("Add", ["y4", "small"], ["z"])]
    consts = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("starts", 0), ("ends", 4), ("axes", 1))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 600])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])], [big, small] + consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_a_data_file_of_that_name_in_the_current_directory_is_no_obstacle(tmp_path, monkeypatch):
    """`specrt compile` run inside a checkpoint folder holding `model.onnx.data` failed with FileExistsError (onnx
    looked for the data file in the current directory, not beside the graph)."""
    cwd = tmp_path / "checkpoint"
    cwd.mkdir()
    (cwd / "model.onnx.data").write_bytes(b"someone else's file")
    monkeypatch.chdir(cwd)
    out = tmp_path / "bundle" / "target"
    out.mkdir(parents=True)
    path = save_onnx(tiny_model(), out / "model.onnx")
    assert (cwd / "model.onnx.data").read_bytes() == b"someone else's file"
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "model.onnx.data"]
    # the same files onnx writes itself where it does not refuse
    ref = tmp_path / "ref"
    ref.mkdir()
    monkeypatch.chdir(ref)
    onnx.save_model(tiny_model(), str(ref / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    assert (out / "model.onnx.data").read_bytes() == (ref / "model.onnx.data").read_bytes()
    assert (out / "model.onnx").read_bytes() == (ref / "model.onnx").read_bytes()
    x = np.zeros((1, 600), np.float32)
    (z,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(z, [[1.0, 2.0, 3.0, 4.0]])
