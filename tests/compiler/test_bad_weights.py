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


def test_a_config_that_ties_embeddings_the_weights_do_not_tie_is_refused(tmp_path, llama_target):
    # transformers does not tie an lm_head.weight that differs from the embeddings: compiling it tied would give
    # other outputs than transformers, silently
    import json

    from safetensors.torch import load_file, save_file

    ckpt = shutil.copytree(llama_target, tmp_path / "ckpt")
    tensors = load_file(str(ckpt / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = embed + 0.5  # differs from the embeddings
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**raw, "tie_word_embeddings": True}))
    from helpers import run_cli

    args = ("compile", "--target", ckpt, "-o", tmp_path / "b", "--max-seq-len", "64", "--max-draft-tokens", "4")
    proc = run_cli(*args)
    assert proc.returncode == 2 and "tie_word_embeddings" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "b").exists()
    tensors["lm_head.weight"] = embed.clone()  # a stored copy of the tied weights: fine
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    open_checkpoint(ckpt).load_decoder()


def test_validation_treats_non_finite_outputs_as_failure(tmp_path, llama_target):
    decoder = open_checkpoint(llama_target).load_decoder()
    onnx_path = onnx_from_decoder(decoder, tmp_path / "model.onnx")
    stats = validate_onnx(decoder, onnx_path, [(3, 0)])
    assert stats["max_abs_diff"] < 1e-4  # the healthy pair passes
    with torch.no_grad():
        next(decoder.parameters()).fill_(float("nan"))  # the reference now yields NaN everywhere
    with pytest.raises(ValidationError, match="non-finite"):
        validate_onnx(decoder, onnx_path, [(3, 0)])
