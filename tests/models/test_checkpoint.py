"""Checkpoint reader limits (issue 10 #10, #12): shard paths stay inside, absurd configs are refused early."""

import json
import shutil

import pytest

from specrt.models.checkpoint import estimate_parameters, open_checkpoint
from specrt.core.errors import CheckpointError


@pytest.mark.parametrize("shard", ["/etc/passwd", "../outside.safetensors", "sub/../../x.safetensors"])
def test_index_shard_paths_must_stay_inside(tmp_path, llama_target, shard):
    ckpt = shutil.copytree(llama_target, tmp_path / "ckpt")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": shard}}))
    with pytest.raises(CheckpointError, match="shard"):
        open_checkpoint(ckpt)


def test_shard_symlink_out_of_the_checkpoint_is_refused(tmp_path, llama_target):
    ckpt = shutil.copytree(llama_target, tmp_path / "ckpt")
    shutil.move(ckpt / "model.safetensors", tmp_path / "elsewhere.safetensors")
    (ckpt / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model.safetensors"}}))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        open_checkpoint(ckpt)


def test_parameter_estimate_matches_the_module(llama_target):
    ck = open_checkpoint(llama_target)
    real = sum(p.numel() for p in ck.load_decoder().parameters())
    assert abs(estimate_parameters(ck.config) - real) / real < 0.01


def test_absurd_config_is_refused_before_allocating(tmp_path, llama_target):
    ckpt = shutil.copytree(llama_target, tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(hidden_size=262144, intermediate_size=1048576, num_hidden_layers=200, num_attention_heads=64,
               num_key_value_heads=64, head_dim=4096)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    from helpers import run_cli

    proc = run_cli("compile", "--target", ckpt, "-o", tmp_path / "b", "--max-seq-len", "64", "--max-draft-tokens", "4")
    assert proc.returncode == 2, proc.stderr
    assert "parameters" in proc.stderr and "GiB" in proc.stderr and "Traceback" not in proc.stderr


def hub_cache_layout(repo, source):
    """`source`'s files as the Hugging Face hub cache holds them: REPO/snapshots/REV/NAME -> ../../blobs/HASH."""
    import hashlib

    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for f in source.iterdir():
        blob = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, repo / "blobs" / blob)
        (snapshot / f.name).symlink_to(f"../../blobs/{blob}")
    return snapshot


def test_sharded_checkpoint_in_the_hub_cache_layout_opens(tmp_path, llama_target):
    """A sharded model downloaded by `huggingface-cli download` links each shard into the repository's blobs
    folder: it was refused ("resolves to .../blobs/..., outside the checkpoint"), so no sharded hub model compiled."""
    from safetensors import safe_open

    source = shutil.copytree(llama_target, tmp_path / "src")
    with safe_open(str(source / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    (source / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: "model.safetensors" for n in names}}))
    snapshot = hub_cache_layout(tmp_path / "models--org--tiny", source)
    ck = open_checkpoint(snapshot)
    assert [p.name for p in ck.weight_files] == ["model.safetensors"]
    assert sum(p.numel() for p in ck.load_decoder().parameters()) > 0
    outside = tmp_path / "elsewhere.safetensors"  # a link out of the repository is still refused
    shutil.copy(source / "model.safetensors", outside)
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        open_checkpoint(snapshot)
