"""TensorRT batch profiles and the graph TensorRT parses (`--max-batch`), without TensorRT: the profiles' batch
ranges, the manifest checks they pass, the `past_lengths` input made a real input (run here on ONNX Runtime), and
every refusal before GPU work. The engine itself runs in tests/trt/test_gpu.py (skipped without a GPU)."""

import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from specrt.bundle import graph_io
from specrt.bundle.checks import check_profiles
from specrt.bundle.manifest import read_manifest
from specrt.bundle.profiles import phase_in_profiles, profiles_for_model, profiles_max_batch
from specrt.compiler import EngineSpec
from specrt.compiler.trt.build import trt_input_graph
from specrt.compiler.trt.options import BuildOptions
from specrt.compiler.trt.compile_steps import batched_entry, trt_extra_steps
from specrt.core.errors import BackendUnavailable, InvalidArgument
from specrt.runtime.backends import create_batch_runner
from tests.helpers import run_cli

CONFIG = types.SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def bundle(workdir, llama_target):
    from specrt.compiler import CompileSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "trt_batch_cpu", max_seq_len=48,
                                      max_draft_tokens=4, ort_graph="both"))


def test_batch_profiles_cover_every_phase_and_pass_the_manifest_checks():
    p = profiles_for_model(CONFIG, 128, 8, max_batch=8, past_lengths=True)
    assert profiles_max_batch(p) == 8 and profiles_max_batch(profiles_for_model(CONFIG, 128, 8)) == 1
    assert p["decode"][graph_io.INPUT_IDS] == {"min": [1, 1], "opt": [8, 1], "max": [8, 1]}
    assert p["prefill"][graph_io.INPUT_IDS]["opt"] == [1, 128] and p["verify"][graph_io.INPUT_IDS]["max"] == [8, 9]
    assert p["verify"][graph_io.past_key(1)]["max"] == [8, 127, 2, 16]  # the static block: P = max_seq_len - 1
    assert p["decode"][graph_io.PAST_LENGTHS] == {"min": [1], "opt": [8], "max": [8]}
    check_profiles(p, "models.target", 128, 8)  # what `load` checks: still the bundle's limits
    # the batch runner's calls (P = max_seq_len - 1 always) land in the phase of their S
    assert phase_in_profiles(p, 1, 127, batch=8) == "decode"
    assert phase_in_profiles(p, 9, 127, batch=3) == "verify"
    assert phase_in_profiles(p, 100, 127, batch=2) == "prefill"
    with pytest.raises(ValueError, match="9 sequences of S=1.*decode: B 1..8"):
        phase_in_profiles(p, 1, 127, batch=9)
    with pytest.raises(ValueError, match="max_batch"):
        profiles_for_model(CONFIG, 128, 8, max_batch=0)


def test_trt_parses_past_lengths_as_a_real_input(bundle, tmp_path):
    m = read_manifest(bundle)
    src = m.path(m.models["target"].onnx)
    out = trt_input_graph(src, tmp_path / "model.trt-input.onnx", max_batch=4)
    model = onnx.load(str(out), load_external_data=False)
    assert graph_io.PAST_LENGTHS in [i.name for i in model.graph.input]
    assert graph_io.PAST_LENGTHS not in [t.name for t in model.graph.initializer]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert graph_io.PAST_LENGTHS in [i.name for i in session.get_inputs()]  # required now, as for TensorRT
    assert graph_io.TREE_MASK in [i.name for i in session.get_inputs()]  # so is the tree mask (docs/trees.md)
    c = m.models["target"].decoder_config
    feeds = {graph_io.INPUT_IDS: np.array([[5], [6]], np.int64), graph_io.POSITION_IDS: np.array([[3], [1]], np.int64),
             graph_io.PAST_LENGTHS: np.array([3, 1], np.int64),
             graph_io.TREE_MASK: np.ones((1, 1), np.bool_)}  # the chain, as the TensorRT runners bind it
    for i in range(c.num_layers):
        for name in (graph_io.past_key(i), graph_io.past_value(i)):
            feeds[name] = np.random.default_rng(i).standard_normal((2, 3, c.num_kv_heads, c.head_dim)).astype(np.float32)
    masked = session.run([graph_io.LOGITS], feeds)[0]
    feeds[graph_io.PAST_LENGTHS] = np.array([3, 3], np.int64)
    assert np.allclose(masked[0], session.run([graph_io.LOGITS], feeds)[0][0])  # slot 0: same lengths
    assert not np.allclose(masked[1], session.run([graph_io.LOGITS], feeds)[0][1])  # slot 1: rows 1, 2 masked


def test_a_graph_without_past_lengths_refuses_a_batched_build(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]))
    onnx.save(model, str(tmp_path / "old.onnx"))
    assert trt_input_graph(tmp_path / "old.onnx", tmp_path / "t.onnx", max_batch=1) == tmp_path / "old.onnx"
    with pytest.raises(InvalidArgument, match="does not read past_lengths"):
        trt_input_graph(tmp_path / "old.onnx", tmp_path / "t.onnx", max_batch=4)


def test_max_batch_options_are_checked_before_any_work(bundle):
    with pytest.raises(InvalidArgument, match="--max-batch must be in"):
        EngineSpec("trt", max_batch=0)
    with pytest.raises(InvalidArgument, match="add --engines trt"):
        EngineSpec("none", max_batch=4)
    with pytest.raises(InvalidArgument, match="add --engines trt"):
        trt_extra_steps({"engines": "none", "max_batch": 4}, 64, 4)
    with pytest.raises(InvalidArgument, match="--max-batch must be in"):
        BuildOptions(max_batch=1000)
    entry = read_manifest(bundle).models["target"]
    assert batched_entry(entry, 48, 4, 1) is entry
    batched = batched_entry(entry, 48, 4, 4)
    assert profiles_max_batch(batched.profiles) == 4 and batched.profiles["verify"]["past_key.0"]["max"][1] == 47


def test_batch_runner_on_trt_refuses_before_gpu_work(bundle):
    m = read_manifest(bundle)
    with pytest.raises(InvalidArgument, match="at most 1 sequence.*--max-batch 4"):
        create_batch_runner(m, "target", "trt", max_batch=4)  # batch-1 profiles: refused in Python
    with pytest.raises((BackendUnavailable, Exception), match="TensorRT|engine"):
        create_batch_runner(m, "target", "trt", max_batch=1)


def test_compile_cli_max_batch_needs_engines_trt(llama_target, tmp_path):
    r = run_cli("compile", "--target", str(llama_target), "-o", str(tmp_path / "b"), "--max-seq-len", "32",
                "--max-batch", "4")
    assert r.returncode == 2 and "add --engines trt" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b").exists()
