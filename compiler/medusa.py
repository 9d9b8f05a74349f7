"""`medusa_step`: export Medusa heads (plus the target's lm_head) as `medusa/heads.onnx` in the bundle.

Graph: input `hidden_states` [N, D] -> output `medusa_logits` [N, H, V]. The target graph already
returns `hidden_states`, so the proposer feeds it the hidden state of the last accepted position.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from specrt.bundle.entries import TensorSpec
from specrt.bundle.parts import MedusaEntry
from specrt.bundle.writer import ManifestDraft
from specrt.models.checkpoint import check_finite, open_checkpoint
from specrt.core.errors import CheckpointError
from specrt.models.config_files import read_json
from specrt.models.medusa import MedusaHeadsWithLMHead
from specrt.compiler.export import export_module
from specrt.compiler.validate import ValidationError

CONFIG = "medusa_config.json"
WEIGHTS = "medusa.safetensors"


def load_heads(medusa_dir: Path, target_dir: Path) -> tuple[MedusaHeadsWithLMHead, dict[str, Any]]:
    from safetensors.torch import load_file

    medusa_dir = Path(medusa_dir)
    if not (medusa_dir / CONFIG).exists() or not (medusa_dir / WEIGHTS).exists():
        raise CheckpointError(f"{medusa_dir} is not a Medusa heads directory: needs {CONFIG} and {WEIGHTS}")
    cfg = read_json(medusa_dir / CONFIG)
    target = open_checkpoint(target_dir)
    tc = target.config
    num_heads, hidden = check_heads_config(cfg, medusa_dir)
    if hidden != tc.hidden_size or int(cfg.get("vocab_size", tc.vocab_size)) != tc.vocab_size:
        raise CheckpointError(
            f"Medusa heads were trained for hidden_size={hidden}, vocab_size={cfg.get('vocab_size')}; the target has "
            f"hidden_size={tc.hidden_size}, vocab_size={tc.vocab_size}"
        )
    if int(cfg.get("medusa_num_layers", 1)) != 1 or not cfg.get("shares_target_lm_head", True):
        raise CheckpointError("only Medusa heads with one residual layer sharing the target's lm_head are supported")
    try:
        tensors = load_file(str(medusa_dir / WEIGHTS))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"cannot read {medusa_dir / WEIGHTS}: {exc}") from None
    if any(t.shape[-1] != hidden for t in tensors.values()):
        raise CheckpointError(f"{medusa_dir / WEIGHTS} does not hold {num_heads} heads of width {hidden} as "
                              f"{CONFIG} says: the directory is corrupt")
    check_finite(tensors, medusa_dir)
    module = MedusaHeadsWithLMHead(num_heads, hidden, tc.vocab_size)
    state = {f"heads.{i}.{p}": tensors[f"heads.{i}.{p}"].float() for i in range(num_heads) for p in ("weight", "bias")}
    state["lm_head.weight"] = target.load_decoder().lm_head_weight().detach().float()
    module.load_state_dict(state)
    return module.eval(), cfg


MAX_HEADS = 16


def check_heads_config(cfg: dict[str, Any], medusa_dir: Path) -> tuple[int, int]:
    """(number of heads, hidden size) from medusa_config.json, refused unless both are sane integers and the
    weights file holds exactly those heads (checked from its header, before anything is allocated)."""
    from safetensors import safe_open

    heads, hidden = cfg.get("medusa_num_heads"), cfg.get("hidden_size")
    if not isinstance(heads, int) or isinstance(heads, bool) or not 1 <= heads <= MAX_HEADS:
        raise CheckpointError(f"{medusa_dir / CONFIG}: medusa_num_heads must be an integer in [1, {MAX_HEADS}], "
                              f"got {heads!r}")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
        raise CheckpointError(f"{medusa_dir / CONFIG}: hidden_size must be a positive integer, got {hidden!r}")
    try:
        with safe_open(str(medusa_dir / WEIGHTS), "pt") as f:
            names = set(f.keys())
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"cannot read {medusa_dir / WEIGHTS}: {exc}") from None
    expected = {f"heads.{i}.{p}" for i in range(heads) for p in ("weight", "bias")}
    if names != expected:
        raise CheckpointError(f"{medusa_dir / WEIGHTS} holds {len(names) // 2} heads, {CONFIG} says {heads}: "
                              "the directory is corrupt")
    return heads, hidden


def export_heads(module: MedusaHeadsWithLMHead, path: Path) -> None:
    n = torch.export.Dim("positions", min=1, max=4096)
    export_module(module, (torch.randn(3, module.lm_head.in_features),), path, ["hidden_states"],
                  ["medusa_logits"], ({0: n},), "Medusa heads")


def validate_heads(module: MedusaHeadsWithLMHead, path: Path, atol: float = 1e-4) -> float:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(5, module.lm_head.in_features, generator=torch.Generator().manual_seed(0))
    got = sess.run(None, {"hidden_states": x.numpy()})[0]
    with torch.no_grad():
        ref = module(x).numpy()
    diff = float(np.abs(got - ref).max())
    if diff > atol + atol * float(np.abs(ref).max()):
        raise ValidationError(f"{path.name}: Medusa heads differ from PyTorch by {diff:.3g}")
    return diff


def medusa_step(medusa_dir: Path, target_dir: Path) -> Callable[[Path, ManifestDraft], None]:
    """The compile step (`CompileSpec.medusa`) that adds the heads to the bundle being written."""

    def step(tmp: Path, manifest: ManifestDraft) -> None:
        module, cfg = load_heads(medusa_dir, target_dir)
        (tmp / "medusa").mkdir()
        export_heads(module, tmp / "medusa" / "heads.onnx")
        diff = validate_heads(module, tmp / "medusa" / "heads.onnx")
        shutil.copy2(Path(medusa_dir) / CONFIG, tmp / "medusa" / CONFIG)
        manifest.medusa = MedusaEntry(
            num_heads=len(module.heads), onnx="medusa/heads.onnx", onnx_data="medusa/heads.onnx.data",
            config=f"medusa/{CONFIG}", inputs=(TensorSpec("hidden_states", ("N", module.lm_head.in_features)),),
            outputs=(TensorSpec("medusa_logits", ("N", len(module.heads), module.lm_head.out_features)),),
            validation={"max_abs_diff": diff}, source_config=cfg)

    # Fail fast (before any export) on a bad heads directory.
    load_heads(medusa_dir, target_dir)
    return step
