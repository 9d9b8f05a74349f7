"""How a draft-head directory stores its trained parameters (`head.safetensors`), and reading them back in fp32.

`head_config.json`'s `storage` (specrt/models/head_config.py: STORAGES) says which form the file holds:

    "float32" / "float16"   every tensor a float tensor (a config without `storage`, written before #52, is read
                            the same way: any float dtype)
    "int8"                  each trained weight matrix W [out, in] as int8 q [out, in] plus `<name>_scale` [out]
                            (float32): W ~= q * scale[:, None], scale = max|W[row]| / 127 (symmetric, per output
                            row, round to nearest: |error| <= scale / 2 per weight); 1-D tensors (biases, norms)
                            stay float16

`pack` makes the form to write, `read_trained` reads a directory back (dequantized to fp32, NaN/Inf refused), and
`convert_head_dir` rewrites a head directory in another storage without its target (how the shipped SmolLM2 head
became int8). A file that does not match its config (int8 tensors under a float storage, a matrix without its
scale, a scale of the wrong length, a file that is not safetensors) is refused with one CheckpointError line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from specrt.core.errors import CheckpointError
from specrt.models.head_config import STORAGES

SCALE = "_scale"  # "fc.weight" -> "fc.weight_scale": the per-row scales of an int8 matrix
QMAX = 127
DTYPES = {"float32": torch.float32, "float16": torch.float16, "int8": torch.int8}
FLOATS = ("F64", "F32", "F16", "BF16")  # safetensors' names of the float dtypes
NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8"}


def storage_of_dtype(dtype: torch.dtype) -> str:
    """torch.float32 / float16 / int8 -> the `storage` name; anything else is refused."""
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"a head is stored as float32, float16 or int8, not {dtype}")
    return names[dtype]


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (q [out, in] int8, scale [out] float32), symmetric per output row."""
    w = w.detach().float()
    scale = w.abs().amax(dim=1) / QMAX  # [out]
    q = torch.round(w / torch.where(scale > 0, scale, 1.0)[:, None]).clamp(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]  # [out, in]


def pack(tensors: dict[str, torch.Tensor], storage: str) -> dict[str, torch.Tensor]:
    """The tensors to write for `storage` (fp32 tensors in; 2-D ones become int8 + scales under "int8")."""
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    if storage != "int8":
        return {k: v.detach().to(DTYPES[storage]).contiguous() for k, v in tensors.items()}
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if value.dim() == 2:
            out[name], out[name + SCALE] = quantize_int8(value)
        else:
            out[name] = value.detach().to(torch.float16).contiguous()
    return out


def check_form(layout: dict[str, tuple[str, tuple[int, ...]]], storage: str | None, where: str) -> None:
    """Refuse a file whose tensors ({name: (safetensors dtype "F16" / "I8" / ..., shape)}) are not the form
    `storage` names (None: a config from before `storage`, any float), with one CheckpointError naming the tensor."""
    said = f"its head_config.json says storage {storage or 'float (no storage key)'}"
    fix = "the config and the weights come from different exports: export the head again"
    file = f"{where}/head.safetensors"
    for name, (dtype, shape) in layout.items():
        if storage != "int8":
            if dtype not in FLOATS:
                raise CheckpointError(f"{file} holds {name} as {dtype} {list(shape)} but {said}: {fix}")
        elif name.endswith(SCALE):
            matrix = layout.get(name[:-len(SCALE)])
            if matrix is None or matrix[0] != "I8" or dtype not in FLOATS or tuple(shape) != tuple(matrix[1][:1]):
                raise CheckpointError(f"{file} holds {name} {dtype} {list(shape)}, not the float scales [rows] of an "
                                      f"int8 matrix {name[:-len(SCALE)]} (found {matrix or 'none'}): {fix}")
        elif len(shape) == 2 or dtype == "I8":
            if dtype != "I8" or len(shape) != 2 or name + SCALE not in layout:
                raise CheckpointError(f"{file} holds {name} as {dtype} {list(shape)} but {said} (a 2-D I8 matrix "
                                      f"with its float scales {name}{SCALE}): {fix}")
        elif dtype not in FLOATS:
            raise CheckpointError(f"{file} holds {name} as {dtype}: {fix}")


def file_layout(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype, shape)} from a safetensors file's header (no weights read); a file safetensors cannot read
    (truncated, not safetensors) is one CheckpointError."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    except Exception as exc:  # safetensors raises SafetensorError (header) / OSError
        raise CheckpointError(f"{path} is not a readable safetensors file ({_first_line(exc)}): export the head "
                              "again") from None


def unpack(tensors: dict[str, torch.Tensor], storage: str | None, where: str) -> dict[str, torch.Tensor]:
    """The fp32 parameters of a file read as `storage` (`check_form` first); int8 matrices dequantized."""
    check_form({k: (NAMES.get(v.dtype, str(v.dtype)), tuple(v.shape)) for k, v in tensors.items()}, storage, where)
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if name.endswith(SCALE) and storage == "int8":
            continue
        if value.dtype == torch.int8:
            scale = tensors[name + SCALE]
            if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
                raise CheckpointError(f"{where}/head.safetensors: {name}{SCALE} holds negative or non-finite "
                                      "scales: the file is corrupt; export the head again")
            out[name] = dequantize_int8(value, scale)
        else:
            out[name] = value.float()
    return out


def read_trained(head_dir: Path, cfg: dict) -> dict[str, torch.Tensor]:
    """The head directory's trained parameters in fp32 (dequantized when stored as int8), NaN / Inf refused."""
    from safetensors.torch import load_file

    from specrt.models.checkpoint import check_finite

    head_dir = Path(head_dir)
    check_form(file_layout(head_dir / "head.safetensors"), cfg.get("storage"), str(head_dir))
    tensors = unpack(load_file(str(head_dir / "head.safetensors")), cfg.get("storage"), str(head_dir))
    check_finite(tensors, head_dir)
    return tensors


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else "no detail"
    return f"{type(exc).__name__}: {text}"


def convert_head_dir(src: Path, out: Path, storage: str) -> dict[str, float]:
    """Rewrite the head directory `src` into `out` with its parameters stored as `storage` (no target needed: the
    file holds the trained parameters only); the other files are copied, head_config.json gets `storage` (and
    `training.weights_dtype`), metrics.json its `weights_dtype`. Returns {tensor: max |new - old|} in fp32."""
    from safetensors.torch import save_file

    from specrt.models.draft_head import read_head_config

    src, out = Path(src), Path(out)
    cfg = read_head_config(src)
    old = read_trained(src, cfg)
    if out.resolve() != src.resolve():
        shutil.copytree(src, out, dirs_exist_ok=True)
    packed = pack(old, storage)
    new = unpack(packed, storage, str(out))
    save_file(packed, str(out / "head.safetensors"), metadata={"format": "pt"})
    cfg["storage"] = storage
    if isinstance(cfg.get("training"), dict):
        cfg["training"]["weights_dtype"] = storage
    (out / "head_config.json").write_text(json.dumps(cfg) + "\n")
    if (out / "metrics.json").is_file():
        metrics = json.loads((out / "metrics.json").read_text())
        metrics["weights_dtype"] = storage
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return {k: float((new[k] - old[k]).abs().max()) for k in old}
