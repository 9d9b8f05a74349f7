"""Non-finite weights (issue 10 #6): refused by the checkpoint reader, and validation fails on NaN/Inf."""

import shutil

import pytest
import torch

from specrt.models.checkpoint import open_checkpoint
from specrt.compiler.export import onnx_from_decoder
from specrt.compiler.validate import ValidationError, validate_onnx


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_compile_refuses_non_finite_weights_naming_the_tensor(tmp_path, llama_target, bad):
    from safetensors.torch import load_file, save_file

    ckpt = shutil.copytree(llama_target, tmp_path / "ckpt")
    tensors = load_file(str(ckpt / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][3, 5] = bad
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    from helpers import run_cli

    proc = run_cli("compile", "--target", ckpt, "-o", tmp_path / "b", "--max-seq-len", "64", "--max-draft-tokens", "4")
    assert proc.returncode == 2, proc.stderr
    assert name in proc.stderr and "non-finite" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "b").exists()


def test_validation_treats_non_finite_outputs_as_failure(tmp_path, llama_target):
    decoder = open_checkpoint(llama_target).load_decoder()
    onnx_path = onnx_from_decoder(decoder, tmp_path / "model.onnx")
    stats = validate_onnx(decoder, onnx_path, [(3, 0)])
    assert stats["max_abs_diff"] < 1e-4  # the healthy pair passes
    with torch.no_grad():
        next(decoder.parameters()).fill_(float("nan"))  # the reference now yields NaN everywhere
    with pytest.raises(ValidationError, match="non-finite"):
        validate_onnx(decoder, onnx_path, [(3, 0)])
