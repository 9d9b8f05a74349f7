"""`--precision int8 | fp8 | int4` for TensorRT engines: everything but the engine build, on the CPU.

NVIDIA Model Optimizer's ONNX PTQ runs here (calibration on ONNX Runtime's CPU provider); the Q/DQ graphs it
writes are checked for structure (what is quantized, with which types), for the portable graph's I/O, and for
quality: ONNX Runtime runs each Q/DQ graph as written (fake quantization) against the fp32 graph on the built-in
held-out text. The engine build itself needs TensorRT and a GPU (tests/trt/test_gpu.py).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("modelopt.onnx.quantization",
                    reason="needs NVIDIA Model Optimizer's ONNX PTQ: pip install -e '.[dev]' (nvidia-modelopt)")

from specrt.bundle.manifest import read_manifest  # noqa: E402
from specrt.bundle.writer import ManifestDraft, write_manifest  # noqa: E402
from specrt.compiler.quality import GraphScorer  # noqa: E402
from specrt.compiler.quantize_step import QualityRefused  # noqa: E402
from specrt.compiler.trt.build import engine_entry, half_precision  # noqa: E402
from specrt.compiler.trt.options import BuildOptions  # noqa: E402
from specrt.compiler.trt.compile_steps import ptq_config, ptq_step, trt_extra_steps  # noqa: E402
from specrt.compiler.trt.memory import model_row, weight_bytes  # noqa: E402
from specrt.compiler.trt.precision import half_onnx_from_fp32  # noqa: E402
from specrt.compiler.trt.ptq import PTQConfig, import_modelopt, qdq_summary  # noqa: E402
from specrt.core.errors import BackendUnavailable, InvalidArgument  # noqa: E402

# the tests that quantize (Model Optimizer calibration on the packaged demo target) are slow; the option and
# memory checks below them run in the fast lane
ZERO_POINT_TYPE = {"int8": onnx.TensorProto.INT8, "fp8": onnx.TensorProto.FLOAT8E4M3FN}


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory) -> Path:
    """The packaged demo target (a trained toy Llama), compiled once without a draft."""
    from specrt.compiler import CompileSpec, compile_bundle

    target = resources.files("specrt.assets.demo").joinpath("target")
    return compile_bundle(CompileSpec(Path(str(target)), tmp_path_factory.mktemp("ptq") / "demo", max_seq_len=256,
                          max_draft_tokens=4, ort_graph="portable"))


def run_ptq(bundle: Path, dst: Path, options: dict) -> tuple[Path, dict]:
    """The compile step `--precision ...` adds before the engine build, on a copy of `bundle`."""
    shutil.copytree(bundle, dst)
    m = read_manifest(dst)
    draft = ManifestDraft.of(m)
    results: dict = {}
    ptq_step(ptq_config(options), options, results)(dst, draft)
    write_manifest(dst, draft)
    return dst, results


@pytest.fixture(scope="module", params=["int8", "fp8", "int4"])
def quantized(request, demo_bundle, tmp_path_factory):
    precision = request.param
    options = {"engines": "trt", "precision": precision}
    # The cheapest method of each precision: the same Q/DQ graph and facts as the defaults (entropy for int8, awq_clip
    # for int4; their names and defaults: the option tests) without ~25 s histogram and ~45 s search calibrations
    options["ptq_method"] = {"int8": "max", "fp8": "max", "int4": "rtn_dq"}[precision]
    root, results = run_ptq(demo_bundle, tmp_path_factory.mktemp("q") / precision, options)
    return precision, root, results["target"]


@pytest.mark.slow
def test_qdq_graph_structure_and_io(quantized, demo_bundle):
    precision, root, facts = quantized
    source = onnx.load(str(demo_bundle / "target" / "model.onnx"), load_external_data=False)
    qdq = onnx.load(str(root / facts["qdq_onnx"]), load_external_data=False)
    # the runners' I/O is unchanged: same inputs (logit_start too, which modelopt drops) and outputs, in order
    assert [(i.name, i.type) for i in qdq.graph.input] == [(i.name, i.type) for i in source.graph.input]
    assert [o.name for o in qdq.graph.output] == [o.name for o in source.graph.output]
    assert facts["precision"] == precision and facts["tool"] == "nvidia-modelopt"
    assert facts == facts | qdq_summary(onnx.load(str(root / facts["qdq_onnx"]), load_external_data=False))
    dq = [n for n in qdq.graph.node if n.op_type == "DequantizeLinear"]
    inits = {t.name: t for t in qdq.graph.initializer}
    if precision == "int4":  # weight-only: block-wise int4 weights, one DequantizeLinear per projection
        assert {inits[n.input[0]].data_type for n in dq} == {onnx.TensorProto.INT4}
        assert {a.i for n in dq for a in n.attribute if a.name == "block_size"} == {facts["block_size"]}
        assert facts["quantized_matmuls"] == len(dq) == 7 * 9  # q, k, v, o, gate, up, down in 9 layers
        assert facts["unquantized_weight_matmuls"] == 1 and facts["qdq_types"] == {"INT4": len(dq)}  # lm_head
        assert not any(n.op_type == "QuantizeLinear" for n in qdq.graph.node)
    else:  # weights and activations of every weight MatMul through Q/DQ of the precision's type
        assert facts["quantized_matmuls"] == 64 and facts["unquantized_weight_matmuls"] == 0  # lm_head too
        assert facts["quantized_activation_matmuls"] == 4 * 9  # attention scores and values
        zero_points = {inits[n.input[2]].data_type for n in qdq.graph.node
                       if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2}
        assert zero_points == {ZERO_POINT_TYPE[precision]} and list(facts["qdq_types"]) == [
            onnx.TensorProto.DataType.Name(ZERO_POINT_TYPE[precision])]


@pytest.mark.slow
def test_quality_is_measured_on_the_qdq_function(quantized, demo_bundle):
    """The recorded quality is what the Q/DQ graph computes: recomputed here with fresh sessions, then the graph is
    driven the way the runners drive it (a prefill, a verify-shaped call after it, `logit_start` fed)."""
    from specrt.bundle import graph_io
    from specrt.compiler.quality import compare_quality, heldout_text, text_token_ids

    precision, root, facts = quantized
    q = facts["quality"]["heldout"]
    assert q["tokens"] > 500 and q["greedy_agreement"] >= 0.85 and 0.9 < q["ppl_ratio"] < 1.15, q
    dims = {"num_layers": 9, "num_kv_heads": 2, "head_dim": 64}
    ref = GraphScorer(demo_bundle / "target" / "model.onnx", dims)
    got = GraphScorer(root / facts["qdq_onnx"], dims, optimize=False)
    ids = text_token_ids(root / "tokenizer" / "tokenizer.json", heldout_text(), "held-out")
    assert compare_quality(ref, got, ids) == q
    (a, pa), (b, pb) = ref.run(ids[:40], ref.empty_past()), got.run(ids[:40], got.empty_past())
    (a2, _), (b2, _) = ref.run(ids[40:45], pa), got.run(ids[40:45], pb)
    agree = np.mean(np.concatenate([a, a2]).argmax(1) == np.concatenate([b, b2]).argmax(1))
    assert agree >= 0.8 and not np.array_equal(a, b)  # quantized: close, not the same function
    feeds = {graph_io.INPUT_IDS: ids[None, 40:45], graph_io.POSITION_IDS: np.arange(40, 45)[None],
             "logit_start": np.array([3], np.int64)}
    feeds |= {name: past for i in range(9) for name, past in
              ((graph_io.past_key(i), pb[2 * i]), (graph_io.past_value(i), pb[2 * i + 1]))}
    (last_two,) = got.session.run([graph_io.LOGITS], feeds)
    np.testing.assert_allclose(last_two[0], b2[3:], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_tensorrt_input_graph_is_fp16_around_the_qdq_nodes(quantized, tmp_path):
    """The graph the engine build parses: Q/DQ types kept, fp16 elsewhere, fp32 logits; well typed."""
    precision, root, facts = quantized
    assert half_precision(precision) == "fp16"
    half = half_onnx_from_fp32(root / facts["qdq_onnx"], tmp_path / "half.onnx", "fp16")
    model = onnx.load(str(half))
    onnx.checker.check_model(model, full_check=True)  # strict type and shape inference
    inits = {t.name: t for t in model.graph.initializer}
    scales = {inits[n.input[1]].data_type for n in model.graph.node
              if n.op_type == "DequantizeLinear" and n.input[1] in inits}
    assert scales == {onnx.TensorProto.FLOAT16}
    assert {o.name: o.type.tensor_type.elem_type for o in model.graph.output}["logits"] == onnx.TensorProto.FLOAT


@pytest.mark.slow
def test_manifest_records_the_engine_quantization_and_inspect_shows_it(quantized, tmp_path):
    precision, root, facts = quantized
    m = read_manifest(root)
    draft = ManifestDraft.of(m)
    gpu = {"tensorrt_version": "10.13.0", "cuda_version": "12.9", "gpu_name": "NVIDIA H200",
           "compute_capability": "9.0"}
    draft.engines["target"] = engine_entry("target", f"target/model.{precision}.engine",
                                           BuildOptions(precision=precision), gpu, facts)
    (root / "target" / f"model.{precision}.engine").write_bytes(b"not an engine")
    write_manifest(root, draft)
    entry = read_manifest(root).engines["target"]
    assert entry.precision == precision and entry.quantization == facts
    from helpers import run_cli

    proc = run_cli("inspect", root)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "Q/DQ" in x)
    assert f"engine target: {precision} Q/DQ (nvidia-modelopt, {facts['calibration_method']}" in line
    assert f"{facts['quantized_matmuls']} MatMuls quantized" in line and "greedy agreement" in line


@pytest.mark.slow
def test_max_ppl_increase_refuses_and_calibration_data_is_measured(demo_bundle, tmp_path):
    """On Python code the int4 demo target loses perplexity: a limit of 0 refuses it; the user's text is used
    for calibration and measured next to the held-out text."""
    import textwrap

    code = tmp_path / "code.py"
    code.write_text(Path(textwrap.__file__).read_text())
    options = {"engines": "trt", "precision": "int4", "ptq_method": "rtn_dq", "calibration_data": code}
    _, results = run_ptq(demo_bundle, tmp_path / "ok", options)
    facts = results["target"]
    assert set(facts["quality"]) == {"heldout", "calibration"} and facts["calibration_data"] == "code.py"
    assert facts["calibration_method"] == "rtn_dq" and facts["quality"]["calibration"]["ppl_ratio"] > 1
    with pytest.raises(QualityRefused, match="raises perplexity on the calibration text .* --max-ppl-increase 0"):
        run_ptq(demo_bundle, tmp_path / "refused", options | {"max_ppl_increase": 0.0})


def test_option_checks_before_any_work():
    assert ptq_config({"precision": "fp16"}) is None
    assert ptq_config({"precision": "int4"}) == PTQConfig("int4", None)
    assert PTQConfig("fp8").calibration_method == "max" and PTQConfig("int4").calibration_method == "awq_clip"
    with pytest.raises(InvalidArgument, match="--ptq-method awq_clip does not apply to --precision int8"):
        ptq_config({"precision": "int8", "ptq_method": "awq_clip"})
    with pytest.raises(InvalidArgument, match="--ptq-method applies to --precision int8, fp8 or int4, not fp16"):
        ptq_config({"precision": "fp16", "ptq_method": "max"})
    with pytest.raises(InvalidArgument, match="--ptq-method applies to --engines trt"):
        trt_extra_steps({"engines": "none", "precision": "fp32", "ptq_method": "max"}, 128, 4)
    with pytest.raises(InvalidArgument, match="--max-ppl-increase must be >= 0"):
        ptq_config({"precision": "int8", "max_ppl_increase": -1.0})
    steps = trt_extra_steps({"engines": "trt", "precision": "int8"}, 128, 4)
    assert [s.__name__ for s in steps] == ["quantize_graphs", "build_engines"]


def test_missing_model_optimizer_is_one_line_naming_the_package(monkeypatch):
    for name in [n for n in sys.modules if n == "modelopt" or n.startswith("modelopt.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "modelopt", None)  # import modelopt -> ImportError
    with pytest.raises(BackendUnavailable, match=r"NVIDIA Model Optimizer.*specrt\[trt-quant\]"):
        import_modelopt()


def test_memory_plan_counts_low_precision_weights():
    c = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "vocab_size": 1000, "hidden_size": 128,
         "intermediate_size": 256, "num_heads": 2}
    assert (weight_bytes("fp32"), weight_bytes("fp16"), weight_bytes("int8"), weight_bytes("int4")) == (4, 2, 1, 0.5)
    fp16, int4 = (model_row("target", c, 1000, p, 128, 4) for p in ("fp16", "int4"))
    assert int4["kv_cache_bytes"] == fp16["kv_cache_bytes"]  # Q/DQ engines keep an fp16 KV cache
    assert dataclasses.asdict(PTQConfig("int4")) == {"precision": "int4", "method": None, "block_size": 128}


@pytest.mark.skipif(__import__("importlib").util.find_spec("tensorrt") is not None, reason="TensorRT is installed")
def test_compile_cli_refuses_before_any_work(llama_target, tmp_path):
    """`specrt compile` with the new precisions: one-line errors (exit 2 bad input, 1 missing backend), nothing
    written."""
    out = tmp_path / "out" / "bundle"
    from helpers import run_cli

    base = ["compile", "--target", llama_target, "-o", out]
    cases = [
        (["--precision", "int8"], 2, "--precision int8 is for TensorRT engines (add --engines trt)"),
        (["--engines", "trt", "--precision", "int4", "--ptq-method", "max"], 2,
         "--ptq-method max does not apply to --precision int4"),
        (["--engines", "trt", "--precision", "fp8", "--calibration-data", str(tmp_path / "none.txt")], 2,
         "--calibration-data"),
        (["--engines", "trt", "--precision", "int8"], 1, "TensorRT is not installed"),
    ]
    for extra, code, message in cases:
        proc = run_cli(*base, *extra)  # in-process
        assert proc.returncode == code and message in proc.stderr, (extra, proc.stderr)
        assert "Traceback" not in proc.stderr and not out.exists()
