"""`CompileSpec`: construction and validation (in-process, no export), and `specrt compile` building the same
spec a Python caller builds (the CLI's options map one to one onto the spec's fields)."""

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

import specrt.compiler
from specrt.cli.main import main
from specrt.compiler import CompileSpec, EngineSpec, QuantizeSpec
from specrt.compiler.preflight import preflight
from specrt.compiler.tolerance import Tolerance
from specrt.compiler.output_dir import OutputError
from specrt.core.errors import CheckpointError, InvalidArgument


def test_defaults_match_the_cli_defaults(tmp_path):
    spec = CompileSpec(str(tmp_path / "t"), str(tmp_path / "o"))
    assert spec.target == tmp_path / "t" and spec.output == tmp_path / "o"  # strings become paths
    assert (spec.max_seq_len, spec.max_draft_tokens, spec.ort_graph) == (2048, 8, "fused")
    assert spec.tolerance == Tolerance(1e-4, 1e-3) and spec.quantize == QuantizeSpec()
    assert spec.engines.kind == "none" and spec.draft is None and spec.head_dir is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.max_seq_len = 4


def test_draft_forms(tmp_path):
    assert CompileSpec("t", "o", Path("self:int4")).draft == "self:int4"  # click hands over a Path
    head = CompileSpec("t", "o", f"head:{tmp_path / 'h'}")
    assert head.head_dir == tmp_path / "h"
    assert CompileSpec("t", "o", str(tmp_path / "d")).draft == tmp_path / "d"


def test_tolerance_forms():
    assert CompileSpec("t", "o", tolerance="1e-3,0.01").tolerance == Tolerance(1e-3, 0.01)
    assert CompileSpec("t", "o", tolerance=(0.5, 0.0)).tolerance == Tolerance(0.5, 0.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_seq_len=1), "--max-seq-len must be at least 2"),
    (dict(max_seq_len="64"), "--max-seq-len must be an integer"),
    (dict(max_draft_tokens=0), r"--max-draft-tokens must be in \[1, 64\]"),
    (dict(max_draft_tokens=65), r"--max-draft-tokens must be in \[1, 64\]"),
    (dict(max_seq_len=8, max_draft_tokens=7), "leaves no room"),
    (dict(ort_graph="fast"), "--ort-graph must be one of fused, portable, both"),
    (dict(tolerance="1e-4"), "--tolerance must be ATOL,RTOL"),
    (dict(tolerance=(-1.0, 0.0)), "tolerance atol must be a finite number >= 0"),
    (dict(target=None), "a target is required"),
    (dict(quantize="int4"), "quantize must be a QuantizeSpec"),
    (dict(engines="trt"), "engines must be a EngineSpec"),
])
def test_bad_values_are_one_line_invalid_argument(kwargs, match):
    with pytest.raises(InvalidArgument, match=match) as info:
        CompileSpec(**({"target": "t", "output": "o"} | kwargs))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("build, match", [
    (lambda: QuantizeSpec(target="int3"), "--quantize must be one of int8, int4"),
    (lambda: QuantizeSpec(block_size=100), "--quant-block-size must be a power of two"),
    (lambda: QuantizeSpec(accuracy_level=1, batch_invariant=False), "level 4 only"),
    (lambda: QuantizeSpec(max_ppl_increase=-0.1), "--max-ppl-increase must be >= 0"),
    (lambda: EngineSpec(kind="tensorrt"), "--engines must be one of none, trt"),
    (lambda: EngineSpec(precision="int2"), "--precision must be one of"),
    (lambda: EngineSpec(builder_optimization_level=9), r"--builder-optimization-level must be in \[0, 5\]"),
    (lambda: EngineSpec(workspace=0), "--workspace must be a positive size"),
    (lambda: EngineSpec(hardware_compat="any"), "--hardware-compat must be one of"),
])
def test_bad_part_values(build, match):
    with pytest.raises(InvalidArgument, match=match):
        build()


def test_preflight_checks_files_before_any_export(tmp_path, llama_target):
    with pytest.raises(CheckpointError, match="--target .*no such directory"):
        preflight(CompileSpec(tmp_path / "missing", tmp_path / "o"))
    with pytest.raises(CheckpointError, match="--medusa .* has no medusa_config.json"):
        preflight(CompileSpec(llama_target, tmp_path / "o", medusa=llama_target))
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "x").write_text("x")
    with pytest.raises(OutputError, match="--force"):
        preflight(CompileSpec(llama_target, tmp_path / "existing"))
    with pytest.raises(InvalidArgument, match="--calibration-data .*no such file"):
        preflight(CompileSpec(llama_target, tmp_path / "o", quantize=QuantizeSpec("int4",
                                                                                 calibration_data=tmp_path / "x")))
    with pytest.raises(InvalidArgument, match="--draft-quantize needs a draft checkpoint"):
        preflight(CompileSpec(llama_target, tmp_path / "o", quantize=QuantizeSpec(draft="int8")))
    plan = preflight(CompileSpec(llama_target, tmp_path / "o", "self:int4", medusa=None))
    assert plan.draft is None and plan.quantization.self_draft.type == "int4" and plan.steps == ()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]  # nothing written


def test_compile_bundle_takes_only_a_spec(tmp_path, llama_target):
    from specrt.compiler import compile_bundle

    with pytest.raises(TypeError, match="one CompileSpec"):
        compile_bundle(llama_target)


def run_cli_capturing(monkeypatch, args):
    """Run `specrt compile ARGS` in-process; return the spec it passed to compile_bundle (nothing compiles)."""
    seen = []

    def fake(spec, progress=None, extra_steps=None):
        seen.append(spec)
        raise InvalidArgument("captured")

    monkeypatch.setattr(specrt.compiler, "compile_bundle", fake, raising=False)
    res = CliRunner().invoke(main, ["compile", *args])
    assert res.exit_code == 2 and "captured" in res.output, res.output
    return seen[0]


def test_cli_builds_the_spec_python_builds(monkeypatch, tmp_path):
    cal = tmp_path / "cal.txt"
    args = ["--target", "ckpt/t", "--draft", "self:int8", "-o", "out/b", "--max-seq-len", "256",
            "--max-draft-tokens", "6", "--force", "--ort-graph", "both", "--keep-fp32", "--tolerance", "1e-3,0.01",
            "--quantize", "int4", "--quant-block-size", "64", "--quant-asymmetric", "--quant-accuracy-level", "4",
            "--quant-fast-decode", "--calibration-data", str(cal), "--max-ppl-increase", "0.1",
            "--gpu-memory-budget", "2GiB"]
    expected = CompileSpec("ckpt/t", "out/b", "self:int8", max_seq_len=256, max_draft_tokens=6, force=True,
                           ort_graph="both", keep_fp32=True, tolerance=Tolerance(1e-3, 0.01),
                           quantize=QuantizeSpec("int4", block_size=64, symmetric=False, accuracy_level=4,
                                                 batch_invariant=False, calibration_data=cal, max_ppl_increase=0.1),
                           engines=EngineSpec(gpu_memory_budget=2 << 30))
    assert run_cli_capturing(monkeypatch, args) == expected


def test_cli_engine_and_medusa_options_reach_the_spec(monkeypatch, tmp_path):
    args = ["--target", "t", "-o", "o", "--medusa", "heads", "--engines", "trt", "--precision", "fp16",
            "--hardware-compat", "ampere-plus", "--version-compatible", "--workspace", "512MiB",
            "--builder-optimization-level", "2", "--timing-cache", "cache.bin"]
    expected = CompileSpec("t", "o", medusa="heads",
                           engines=EngineSpec("trt", precision="fp16", hardware_compat="ampere-plus",
                                              version_compatible=True, workspace=512 << 20,
                                              builder_optimization_level=2, timing_cache="cache.bin"))
    assert run_cli_capturing(monkeypatch, args) == expected
    assert CompileSpec("t", "o", f"head:{tmp_path}") == run_cli_capturing(
        monkeypatch, ["--target", "t", "-o", "o", "--draft", f"head:{tmp_path}"])


def test_cli_refuses_a_bad_value_with_exit_2_before_compiling(monkeypatch):
    monkeypatch.setattr(specrt.compiler, "compile_bundle", lambda *a, **k: pytest.fail("compiled"), raising=False)
    res = CliRunner().invoke(main, ["compile", "--target", "t", "-o", "o", "--max-seq-len", "8",
                                    "--max-draft-tokens", "7"])
    assert res.exit_code == 2 and "leaves no room" in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
