"""Quantized bundles: MatMulNBits graphs that ONNX Runtime loads, quality in the manifest, the quantized target
as its own draft, and speculation over a quantized target that stays identical to plain decoding."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from specrt.bundle.manifest import read_manifest
from specrt.cli.main import main
from specrt.compiler import CompileSpec, compile_bundle
from specrt.compiler.fused_scorer import FusedScorer
from specrt.compiler.quality import GraphScorer, verify_consistency
from specrt.compiler.quantize import QuantizationError, QuantizeConfig, quantize_onnx
from specrt.core.errors import InvalidArgument
from specrt.runtime import load

PROMPTS = ["def main(argv):", "import os\nimport sys\n", "class Parser:\n    def __init__(self", "x = [", "for"]


@pytest.fixture(scope="module")
def int4_self8(int4_self8_bundle):
    """int4 target (default settings) with the int8 copy of the target as its draft (tests/conftest.py)."""
    return int4_self8_bundle


@pytest.fixture(scope="module")
def fp32_self4(workdir, llama_target):
    """Unquantized target with the int4 copy of the target as its draft (its quantized portable graph kept)."""
    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "fp32_self4", "self:int4", max_seq_len=256,
                          max_draft_tokens=8, ort_graph="both"))


def graph_ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_manifest_records_quantization_and_quality(int4_self8):
    m = read_manifest(int4_self8)
    target, draft = m.models["target"], m.models["draft"]
    q = target.quantization
    assert (q.type, q.bits, q.block_size, q.symmetric, q.accuracy_level) == ("int4", 4, 32, True, 4)
    assert q.min_rows == 2 and q.batch_invariant_setting
    assert q.reference_onnx == target.onnx == "target/model.onnx"
    graph = q.graphs["portable"]
    assert graph.onnx in m.files and graph.onnx_data in m.files
    assert graph.quantized_matmuls == 2 * 7 + 1 and graph.unquantized_weight_matmuls == 0  # 2 layers + head
    ops = graph_ops(m.path(graph.onnx))
    assert ops.count("MatMulNBits") == 15 and "MatMulNBits" not in graph_ops(m.path(target.onnx))
    heldout = q.quality["heldout"]
    assert heldout["tokens"] > 1000 and 0.2 < heldout["greedy_agreement"] < 1.0
    assert heldout["ppl_ratio"] == pytest.approx(heldout["ppl_quantized"] / heldout["ppl_reference"])
    assert q.verify_consistency["rows"] == 16 * 9 and q.verify_consistency["graph"] == "fused"
    assert q.verify_consistency["identical_fraction"] == 1.0
    # the self draft: the target's graph quantized again, nothing exported twice
    assert draft.self_draft and draft.onnx == "target/model.onnx"
    assert draft.quantization.type == "int8"
    assert draft.quantization.graphs["portable"].onnx == "draft/model.int8.onnx"
    assert draft.quantization.quality["heldout"]["greedy_agreement"] > heldout["greedy_agreement"]


def test_ort_runs_the_quantized_graph_and_torch_the_reference(int4_self8):
    m = read_manifest(int4_self8)
    entry = m.models["target"]
    ids = np.array([5, 17, 42, 99, 7], dtype=np.int64)
    dims = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16}
    quantized, _ = GraphScorer(m.path(entry.quantization.graphs["portable"].onnx), dims).run(
        ids, GraphScorer(m.path(entry.onnx), dims).empty_past())
    reference, _ = GraphScorer(m.path(entry.onnx), dims).run(ids, GraphScorer(m.path(entry.onnx), dims).empty_past())
    for backend, expected, other in (("ort", quantized, reference), ("ort-portable", quantized, reference),
                                     ("torch", reference, quantized)):
        gen = load(int4_self8, backend=backend)
        gen.target.reset()
        got = gen.target.forward(ids)
        np.testing.assert_allclose(got, expected, atol=1e-4)
        assert np.abs(got - other).max() > 1e-3


@pytest.mark.parametrize("bundle_name", ["int4_self8", "fp32_self4"])
def test_self_draft_and_ngram_outputs_equal_plain_decoding(request, bundle_name):
    gen = load(request.getfixturevalue(bundle_name), backend="ort")
    rejected = compared = 0
    for prompt in PROMPTS:
        plain = gen.generate(prompt, 120, method="none").token_ids
        compared += len(plain)
        for method, k in (("draft", 4), ("draft", 8), ("ngram", 5), ("draft", "auto")):
            res = gen.generate(prompt, 120, method=method, num_speculative_tokens=k)
            assert res.token_ids == plain, (prompt, method, k)
            if method == "draft" and k != "auto":  # adaptive k may switch speculation off on a loaded machine
                assert res.stats.accepted_tokens > 0
                rejected += res.stats.drafted_tokens - res.stats.accepted_tokens
    assert rejected > 0  # the rejection path ran: the draft is not the target
    assert compared > 300  # long outputs (some prompts stop early at EOS)


def test_count_only_policy_costs_a_quantized_self_draft_by_its_bytes(fp32_self4):
    """Seeded sampling's fixed cost model: the int4 copy has the target's parameter count but streams a fraction
    of its bytes per token."""
    from specrt.runtime.policy import model_draft_cost

    m = read_manifest(fp32_self4)
    target, draft = m.models["target"], m.models["draft"]
    assert draft.num_parameters == target.num_parameters
    ratio = m.files[draft.ort_onnx + ".data"].size / m.files[target.ort_onnx + ".data"].size
    assert model_draft_cost("draft", m) == pytest.approx(ratio) and ratio < 0.75


def test_verify_pass_argmax_equals_one_token_passes(int4_self8):
    """At the default settings (level 4, one-token calls padded to two rows as the runners do), a (k+1)-token
    pass of the quantized graph differs from k+1 one-token passes by accumulation noise only, so argmaxes agree
    over many random prompts."""
    m = read_manifest(int4_self8)
    rng = np.random.default_rng(0)
    dims = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16}
    for role in ("target", "draft"):
        q = m.models[role].quantization  # the fused graph (what the runners load), one-token calls as two rows
        scorer = FusedScorer(m.path(q.graphs["fused"].onnx), dims, 256, min_rows=2)
        ids = rng.integers(1, m.tokenizer.vocab_size, 4000)
        stats = verify_consistency(scorer, ids, k=8, trials=40, prefix=24)
        assert stats["rows"] == 40 * 9 and stats["argmax_equal"] == stats["rows"]
        assert stats["max_abs_diff"] < 1e-4


def test_quantize_onnx_needs_weight_matmuls(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 32])
    w = onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [32, 32])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 32])
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x, w], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(QuantizationError, match="no MatMul reads a weight initializer"):
        quantize_onnx(tmp_path / "m.onnx", tmp_path / "q.onnx", QuantizeConfig("int4"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(type="int3"), "int8, int4"),
    (dict(type="int4", block_size=48), "power of two"),
    (dict(type="int4", block_size=8), "power of two"),
    (dict(type="int4", accuracy_level=5), r"\[0, 4\]"),
])
def test_bad_quantize_config(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        QuantizeConfig(**kwargs)


def compile_cli(*args):
    return CliRunner().invoke(main, ["compile", *map(str, args)])


@pytest.mark.parametrize("args, match", [
    (["--quantize", "int3"], "int3"),
    (["--draft-quantize", "int4"], "--draft-quantize needs a draft checkpoint"),
    (["--draft", "self:int2"], "self:int8"),
    (["--draft", "self:int4", "--draft-quantize", "int8"], "quantized already"),
    (["--max-ppl-increase", "0.1"], "need --quantize"),
    (["--quantize", "int4", "--max-ppl-increase", "-1"], ">= 0"),
    (["--quantize", "int4", "--calibration-data", "/nonexistent/file.txt"], "no such file"),
    (["--quantize", "int4", "--quant-block-size", "100"], "power of two"),
    (["--draft", "self:int4", "--engines", "trt"], "ONNX Runtime only"),
    (["--quantize", "int4", "--quant-accuracy-level", "1", "--quant-fast-decode"], "level 4 only"),
])
def test_bad_quantize_options_exit_2_before_any_work(tmp_path, llama_target, args, match):
    res = compile_cli("--target", llama_target, "-o", tmp_path / "b", *args)
    assert res.exit_code == 2, res.output
    assert match in res.output and "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []


def test_calibration_data_and_inspect(tmp_path, llama_target):
    calib = tmp_path / "calib.txt"
    calib.write_text("import json\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n" * 20)
    out = tmp_path / "b"
    res = compile_cli("--target", llama_target, "-o", out, "--max-seq-len", 64, "--max-draft-tokens", 4,
                      "--quantize", "int8", "--calibration-data", calib, "--max-ppl-increase", 100)
    assert res.exit_code == 0, res.output
    q = read_manifest(out).models["target"].quantization
    assert set(q.quality) == {"heldout", "calibration"} and q.calibration_data == "calib.txt"
    assert q.quality["calibration"]["tokens"] < q.quality["heldout"]["tokens"]
    res = CliRunner().invoke(main, ["inspect", str(out), "--json"])
    summary = json.loads(res.output)["models"]["target"]["quantization"]
    # a lean bundle: the quantized portable graph is left out, and inspect lists only what the bundle holds
    assert summary["type"] == "int8" and summary["onnx"] == {"fused": "target/model.fused.int8.onnx"}
    assert not (out / "target" / "model.int8.onnx").exists()
    res = CliRunner().invoke(main, ["inspect", str(out)])
    assert "int8 MatMulNBits" in res.output and "greedy agreement" in res.output


@pytest.mark.slow
def test_max_ppl_increase_refuses_and_writes_nothing(tmp_path):
    """The packaged demo target (trained on Python code) loses some perplexity in int4 on code: a limit of
    0 refuses the bundle with exit 2 and a one-line reason, and leaves nothing behind."""
    import textwrap
    from importlib import resources
    from pathlib import Path

    from helpers import run_cli

    target = resources.files("specrt.assets.demo").joinpath("target")
    calib = tmp_path / "code.py"
    calib.write_text(Path(textwrap.__file__).read_text()[:6000])  # ~2k tokens of code: enough to measure the loss
    out = tmp_path / "out" / "bundle"
    proc = run_cli("compile", "--target", str(target), "-o", str(out), "--max-seq-len", "256", "--max-draft-tokens",
                   "4", "--quantize", "int4", "--calibration-data", str(calib), "--max-ppl-increase", "0")
    assert proc.returncode == 2, proc.stderr
    assert "raises perplexity on the" in proc.stderr and "above --max-ppl-increase 0" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() and list(out.parent.iterdir()) == []


@pytest.mark.slow  # a quantized compile and two commands in real processes
def test_docs_quantize_block_runs(tmp_path, llama_target):
    """docs/quantization.md's quantized-bundle commands, executed as written."""
    import os
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "quantization.md").read_text()
    (block,) = re.findall(r"<!-- readme-test: quantize -->\n```bash\n(.*?)```", readme, flags=re.S)
    shutil.copytree(llama_target, tmp_path / "my-target")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    outputs = []
    for line in block.strip().splitlines():
        proc = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{line}\n{proc.stderr}"
        outputs.append(proc.stdout)
    m = read_manifest(tmp_path / "artifacts" / "my-int4")
    assert m.models["target"].quantization.type == "int4" and m.models["draft"].self_draft
    assert "int4 MatMulNBits" in outputs[-1] and "self draft" in outputs[-1]
