"""Hostile configs and manifests: one clear error (CheckpointError / BundleError), never a raw exception and
never an allocation sized by a number nobody checked."""

import json
import shutil
import time

import pytest
from specrt.bundle.manifest import read_manifest
from specrt.compiler.medusa import load_heads
from specrt.core.errors import BundleError, CheckpointError
from specrt.models.checkpoint import open_checkpoint


@pytest.fixture
def medusa(tmp_path, llama_target):
    from specrt.recipes.medusa import MedusaHeads, save_medusa

    hidden = json.loads((llama_target / "config.json").read_text())["hidden_size"]
    save_medusa(MedusaHeads(2, hidden), tmp_path / "heads", 320)
    return tmp_path / "heads"


@pytest.mark.parametrize("heads", [10**6, 0, -3, "3", None, True])
def test_medusa_head_count_is_checked_before_allocation(medusa, llama_target, heads):
    cfg = json.loads((medusa / "medusa_config.json").read_text())
    cfg["medusa_num_heads"] = heads
    (medusa / "medusa_config.json").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError, match="medusa_num_heads|holds"):
        load_heads(medusa, llama_target)
    assert time.perf_counter() - t0 < 10


def test_medusa_heads_load_when_sane(medusa, llama_target):
    module, cfg = load_heads(medusa, llama_target)
    assert len(module.heads) == 2


def deep(n=100_000):
    return "[" * n + "]" * n


def test_deeply_nested_config_is_a_clear_error(tmp_path, llama_target):
    ck = shutil.copytree(llama_target, tmp_path / "ck")
    (ck / "config.json").write_text(deep())
    with pytest.raises(CheckpointError, match="nested too deeply"):
        open_checkpoint(ck)


def test_deeply_nested_manifest_is_a_clear_error(tmp_path, pair_bundle):
    b = shutil.copytree(pair_bundle, tmp_path / "b")
    (b / "manifest.json").write_text(deep())
    with pytest.raises(BundleError, match="nested too deeply"):
        read_manifest(b)
