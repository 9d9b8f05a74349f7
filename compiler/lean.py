"""Lean quantized bundles: after every graph is compiled and validated, keep only the graphs the chosen backends
run (docs/bundle.md).

With a quantized model, ONNX Runtime on the CPU runs its quantized fused graph; the quantized portable graph is
kept only when the model has no fused graph or `--ort-graph both` asks for it (CUDA / TensorRT providers), and
the fp32 graphs only with `--keep-fp32` (the torch backend, re-quantizing). A model that is not quantized keeps
its fp32 graphs (it runs them), and so does every model that shares them. Bundles with TensorRT engines keep
everything. The manifest keeps the entries of the graphs left out, as the record of what was compiled and
validated, and names them per model in `models.<role>.omitted` (specrt/bundle/entries.py OMITTABLE): whatever
would open one refuses in one line naming the option that keeps it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specrt.bundle.entries import ModelEntry
from specrt.bundle.writer import ManifestDraft


def graph_kinds(entry: ModelEntry) -> dict[str, tuple[str, str | None]]:
    """kind (entries.OMITTABLE) -> (graph file, its weights file) for every graph the entry lists."""
    out = {"portable": (entry.onnx, entry.onnx_data)}
    for name, g in (entry.graphs or {}).items():
        out[name] = (g.onnx, g.onnx_data)
    if entry.quantization is not None:
        for name, g in entry.quantization.graphs.items():
            out[f"quantized.{name}"] = (g.onnx, g.onnx_data)
    return out


def needed_kinds(entry: ModelEntry, keep_fp32: bool, keep_portable: bool) -> set[str]:
    kinds = set(graph_kinds(entry))
    if entry.quantization is None:
        return kinds  # fp32 runs
    keep = {k for k in kinds if k.startswith("quantized.")}
    if "quantized.fused" in keep and not keep_portable:
        keep.discard("quantized.portable")
    if keep_fp32:
        keep |= {k for k in kinds if not k.startswith("quantized.")}
    return keep


def lean_bundle(tmp: Path, manifest: ManifestDraft, *, keep_fp32: bool, keep_portable: bool) -> list[str]:
    """Delete from `tmp` the graph files no chosen backend opens and record them in each entry's `omitted`.
    Returns the deleted relative paths (graphs and their weights)."""
    models = manifest.models
    if manifest.engines or all(e.quantization is None for e in models.values()):
        return []
    needed, listed = set(), set()
    for entry in models.values():
        kinds = graph_kinds(entry)
        listed |= {f for f, _ in kinds.values()}
        needed |= {kinds[k][0] for k in needed_kinds(entry, keep_fp32, keep_portable)}
    drop = listed - needed
    removed = []
    for role, entry in models.items():
        kinds = graph_kinds(entry)
        omitted = tuple(k for k, (f, _) in kinds.items() if f in drop)
        models[role] = dataclasses.replace(entry, omitted=omitted)
        for k in omitted:
            for rel in kinds[k]:
                if rel and (tmp / rel).exists():
                    (tmp / rel).unlink()
                    removed.append(rel)
    return removed
