"""Memory plan and --gpu-memory-budget, without a GPU."""

from __future__ import annotations

import pytest

from specrt.compiler.trt.memory import (DEFAULT_WORKSPACE, activation_bytes, check_budget, kv_cache_bytes,
                                        memory_plan, parse_size, safetensors_parameters)
from specrt.core.errors import InvalidArgument

CFG = {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "vocab_size": 128256, "hidden_size": 4096,
       "intermediate_size": 14336, "num_heads": 32}


@pytest.mark.parametrize("text,expected", [("20GiB", 20 * 2**30), ("512MiB", 512 * 2**20), ("4GB", 4 * 10**9),
                                           ("1.5g", 1_500_000_000), ("1024", 1024), (" 2 kib ", 2048)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "20 parsecs", "-1GiB"])
def test_parse_size_rejects(bad):
    with pytest.raises(InvalidArgument, match="20GiB"):
        parse_size(bad)


def test_kv_formula_llama3_8b_shape():
    # 2 * 32 layers * (8192 + 8 + 1) rows * 8 kv heads * 128 * 2 bytes = 1.00 GiB + headroom
    assert kv_cache_bytes(CFG, 8192, 8, 2) == 2 * 32 * 8201 * 8 * 128 * 2
    s = 256
    assert activation_bytes(CFG, 8192, 2) == (s * 128256 * 4 + s * 4096 * 2 + s * (4 * 4096 + 2 * 14336) * 2
                                              + 32 * s * 8192 * 4)


def test_plan_from_bundle(pair_bundle):
    from specrt.bundle.manifest import read_manifest

    m = read_manifest(pair_bundle, verify_checksums=False)
    plan = memory_plan(m)
    rows = {r["model"]: r for r in plan["rows"]}
    assert rows["target"]["weights_bytes"] == (pair_bundle / "target" / "model.onnx.data").stat().st_size
    assert rows["target"]["workspace_bytes"] == DEFAULT_WORKSPACE
    assert plan["per_device"] == {"cuda:0": rows["target"]["total_bytes"] + rows["draft"]["total_bytes"]}
    half = memory_plan(m, precision="fp16", max_seq_len=64, devices={"draft": "cuda:1"})
    hrows = {r["model"]: r for r in half["rows"]}
    assert hrows["target"]["weights_bytes"] == rows["target"]["weights_bytes"] // 2
    assert set(half["per_device"]) == {"cuda:0", "cuda:1"}


def test_check_budget_names_the_numbers():
    plan = {"rows": [{"device": "cuda:0", "model": "target", "weights_bytes": 16 * 2**30, "kv_cache_bytes": 2**30,
                      "workspace_bytes": 2**30, "activation_bytes": 2**29, "total_bytes": 18.5 * 2**30}],
            "per_device": {"cuda:0": int(18.5 * 2**30)}}
    check_budget(plan, 20 * 2**30)
    with pytest.raises(InvalidArgument, match=r"16\.00 GiB.*budget|budget 16\.00 GiB.*cuda:0 needs 18\.50 GiB"):
        check_budget(plan, 16 * 2**30)


def test_safetensors_parameters_from_headers(llama_target):
    from safetensors.torch import load_file

    files = sorted(llama_target.glob("*.safetensors"))
    assert safetensors_parameters(files) == sum(t.numel() for f in files for t in load_file(str(f)).values())
