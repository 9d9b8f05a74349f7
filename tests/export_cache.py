"""A per-session cache of the dynamo ONNX export for in-process compiles (tests only).

The torch.onnx export is ~90% of a tiny model's compile (6-15 s each on 2 cores) and the suite compiles the same
few tiny checkpoints dozens of times (pair, self, quantized, Medusa, CLI compiles ...). `install()` wraps
`specrt.compiler.pipeline.onnx_from_decoder`: an export whose decoder has exactly the same class, config and
tensors (parameters, buffers and tensor attributes of every submodule, bit for bit) as one exported before in
this session gets a copy of that graph file and its data; everything after the export (graph cleanup, validation
against PyTorch, fused and quantized variants, manifest) still runs on every compile. A decoder changed in any
tensor (e.g. tests/compiler/test_validate.py's broken rope frequencies) is a new key: exported for real.
Subprocess compiles are not cached.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

_cache: dict[str, Path] = {}
_dir: Path | None = None
stats = {"hits": 0, "misses": 0}


def decoder_key(decoder, name: str) -> str:
    import torch

    h = hashlib.sha256()
    h.update(f"{type(decoder).__module__}.{type(decoder).__qualname__}|{decoder.config!r}|{name}".encode())
    for mod_name, module in decoder.named_modules():
        tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        tensors += [(k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor)]
        for t_name, t in sorted(tensors, key=lambda kv: kv[0]):
            t = t.detach().cpu().contiguous().reshape(-1)
            h.update(f"{mod_name}.{t_name}|{t.dtype}|{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _cached(real):
    def onnx_from_decoder(decoder, path, feature_layers=()):
        global _dir
        path = Path(path)
        key = decoder_key(decoder, path.name + (f"|layers={tuple(feature_layers)}" if feature_layers else ""))
        data = Path(str(path) + ".data")
        hit = _cache.get(key)
        if hit is not None:
            stats["hits"] += 1
            shutil.copyfile(hit, path)
            if Path(str(hit) + ".data").exists():
                shutil.copyfile(str(hit) + ".data", data)
            return path
        stats["misses"] += 1
        out = real(decoder, path, feature_layers)
        if _dir is None:
            _dir = Path(tempfile.mkdtemp(prefix="specrt-export-cache-"))
        (_dir / key).mkdir()
        stored = _dir / key / path.name
        shutil.copyfile(path, stored)
        if data.exists():
            shutil.copyfile(data, str(stored) + ".data")
        _cache[key] = stored
        return out

    onnx_from_decoder.cached_export = True
    return onnx_from_decoder


def onnx_from_decoder(decoder, path, feature_layers=()):
    """The cached export for a test that exports a decoder itself (compiler.export.onnx_from_decoder's
    signature): a decoder identical to one exported before in this session gets a copy of that graph."""
    from specrt.compiler import export

    return _cached(export.onnx_from_decoder)(decoder, path, feature_layers)


def install() -> None:
    """Wrap the pipeline's export once it is imported (called before every test: importing it loads torch)."""
    import sys

    pipeline = sys.modules.get("specrt.compiler.pipeline")
    if pipeline is None or getattr(pipeline.onnx_from_decoder, "cached_export", False):
        return
    from specrt.compiler import export

    if pipeline.onnx_from_decoder is export.onnx_from_decoder:  # not while a test has patched it
        pipeline.onnx_from_decoder = _cached(export.onnx_from_decoder)


def cleanup() -> None:
    if _dir is not None:
        shutil.rmtree(_dir, ignore_errors=True)
