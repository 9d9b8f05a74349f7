"""`specrt compile` TensorRT options: parsing, validation, fail-before-work, memory budget -- no GPU needed."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from specrt.cli.main import handle_errors
from specrt.cli.trt_options import trt_compile_options
from specrt.compiler.trt.compile_steps import check_budget_before_build, prepare_trt_compile, trt_extra_steps
from specrt.compiler.trt.options import build_options
from specrt.core.errors import BackendUnavailable, InvalidArgument

tensorrt_missing = pytest.mark.skipif(
    __import__("importlib").util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")


def make_command(seen: dict, target: Path | None = None):
    """A stand-in for `specrt compile`, wired the way core.py is meant to be."""

    @click.command()
    @click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("out"))
    @trt_compile_options
    @handle_errors
    def cmd(output, trt_options):
        seen.update(trt_options)
        if target is not None:
            prepare_trt_compile(trt_options, target=target, draft=None, output=output, max_seq_len=128,
                                max_draft_tokens=8)
        click.echo("built")

    return cmd


def test_options_arrive_as_one_dict():
    seen: dict = {}
    res = CliRunner().invoke(make_command(seen), ["--engines", "trt", "--precision", "bf16", "--hardware-compat",
                                                  "ampere-plus", "--version-compatible", "--workspace", "4GiB",
                                                  "--builder-optimization-level", "5", "--gpu-memory-budget", "20GiB",
                                                  "--max-batch", "8"])
    assert res.exit_code == 0, res.output
    assert seen == {"engines": "trt", "precision": "bf16", "ptq_method": None, "hardware_compat": "ampere-plus",
                    "version_compatible": True, "workspace": 4 * 2**30, "builder_optimization_level": 5,
                    "timing_cache": None, "gpu_memory_budget": 20 * 2**30, "max_batch": 8}


def test_defaults_and_bad_values():
    seen: dict = {}
    assert CliRunner().invoke(make_command(seen), []).exit_code == 0
    assert seen["engines"] == "none" and seen["precision"] == "fp32" and seen["workspace"] is None
    for bad in (["--workspace", "lots"], ["--builder-optimization-level", "9"], ["--precision", "int2"],
                ["--ptq-method", "gptq"], ["--max-batch", "0"]):
        res = CliRunner().invoke(make_command({}), bad)
        assert res.exit_code == 2, (bad, res.output)


def test_build_options_mapping_and_timing_cache_default(tmp_path):
    o = build_options({"hardware_compat": "same-compute-capability", "precision": "fp16"}, tmp_path / "bundle")
    assert o.hardware_compat == "same_compute_capability" and o.precision == "fp16"
    assert o.timing_cache == tmp_path / "bundle.timing-cache"
    assert build_options({"timing_cache": tmp_path / "tc"}).timing_cache == tmp_path / "tc"
    assert trt_extra_steps({"engines": "none"}, 128, 8) == []
    assert len(trt_extra_steps({"engines": "trt"}, 128, 8, tmp_path / "b")) == 1
    with pytest.raises(InvalidArgument, match="builder-optimization-level"):
        build_options({"builder_optimization_level": 7})


@tensorrt_missing
def test_engines_trt_fails_before_any_work(llama_target, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(BackendUnavailable, match=r"TensorRT is not installed.*specrt\[gpu\].*NVIDIA GPU"):
        prepare_trt_compile({"engines": "trt"}, target=llama_target, draft=None, output=out, max_seq_len=128,
                            max_draft_tokens=8)
    assert not out.exists()
    res = CliRunner().invoke(make_command({}, llama_target), ["-o", str(out), "--engines", "trt"])
    assert res.exit_code == 1 and "built" not in res.output
    assert res.output.count("\n") == 1 and res.output.startswith("error: TensorRT is not installed")


def test_budget_refuses_before_building(llama_target, llama_draft):
    plan = check_budget_before_build({"gpu_memory_budget": 2**40}, llama_target, llama_draft, 128, 8)
    assert [r["model"] for r in plan["rows"]] == ["target", "draft"]
    with pytest.raises(InvalidArgument, match=r"exceeds --gpu-memory-budget 1\.0 MiB: cuda:0 needs .*target: "
                                              r"weights .*draft: weights"):
        check_budget_before_build({"gpu_memory_budget": 2**20}, llama_target, llama_draft, 128, 8)
    half = check_budget_before_build({"gpu_memory_budget": 2**40, "engines": "trt", "precision": "fp16",
                                      "workspace": 2**20}, llama_target, None, 128, 8)
    assert half["rows"][0]["weights_bytes"] * 2 == plan["rows"][0]["weights_bytes"]
    assert check_budget_before_build({}, llama_target, None, 128, 8) is None


def test_budget_check_through_the_command(llama_target, tmp_path):
    res = CliRunner().invoke(make_command({}, llama_target), ["--gpu-memory-budget", "1MiB"])
    assert res.exit_code == 2 and res.output.startswith("error: memory plan exceeds --gpu-memory-budget")
