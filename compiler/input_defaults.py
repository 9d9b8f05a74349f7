"""The defaulted inputs of the portable graph: `past_lengths [B]` and `tree_mask [S, S]`.

`add_past_lengths_default` gives `past_lengths` an initializer default `[INT64_MAX]` (every past row valid), so a
caller that never feeds it (the batch-1 runners, validation, calibration, bundles' older code paths) computes
exactly what the graph computed before the input existed; a `tree_mask` input gets the default [[True]] (the chain,
docs/trees.md). TensorRT treats an input that has an initializer as a constant, so `graph_without_default` writes
the copy TensorRT parses, where both are real inputs. The batched pass itself is validated by compiler/past_lengths.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import ALL_ROWS, PAST_LENGTHS, TREE_MASK
from specrt.compiler.onnx_io import save_onnx


def has_past_lengths(model) -> bool:
    """True when the ONNX model (a ModelProto) has the `past_lengths` graph input."""
    return any(i.name == PAST_LENGTHS for i in model.graph.input)


def graph_has_input(onnx_path: Path, name: str) -> bool:
    import onnx

    return any(i.name == name for i in onnx.load(str(onnx_path), load_external_data=False).graph.input)


def add_past_lengths_default(onnx_path: Path) -> bool:
    """Give the graph's `past_lengths` input its default in place (unless it has it). Returns whether the graph
    has the input at all (False, file untouched: a graph exported without it)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path), load_external_data=False)
    if not has_past_lengths(model):
        return False
    if any(t.name == PAST_LENGTHS for t in model.graph.initializer):
        return True
    model = onnx.load(str(onnx_path), load_external_data=True)
    model.graph.initializer.append(numpy_helper.from_array(np.array([ALL_ROWS], dtype=np.int64), PAST_LENGTHS))
    if any(i.name == TREE_MASK for i in model.graph.input):
        broadcast_tree_mask(model)
    save_onnx(model, onnx_path)
    return True


def broadcast_tree_mask(model) -> None:
    """The exported `tree_mask [S, S]` input becomes a defaulted input of its own dims (default [[True]]: the
    chain, docs/trees.md), expanded to [S, S] before its first use. The exporter ties its dims to S (and reads S
    from it), so a [1, 1] feed must never reach those nodes: they read the expanded mask."""
    from onnx import TensorProto, helper, numpy_helper

    expanded = TREE_MASK + "/expanded"
    for node in model.graph.node:
        node.input[:] = [expanded if x == TREE_MASK else x for x in node.input]
    s, ss = TREE_MASK + "/s", TREE_MASK + "/ss"
    model.graph.node.insert(0, helper.make_node("Expand", [TREE_MASK, ss], [expanded], name=expanded))
    model.graph.node.insert(0, helper.make_node("Concat", [s, s], [ss], axis=0, name=ss))
    model.graph.node.insert(0, helper.make_node("Shape", [graph_io.INPUT_IDS], [s], start=1, end=2, name=s))
    graph_input = next(i for i in model.graph.input if i.name == TREE_MASK)
    graph_input.CopyFrom(helper.make_tensor_value_info(TREE_MASK, TensorProto.BOOL, ["tree_rows", "tree_cols"]))
    model.graph.initializer.append(numpy_helper.from_array(np.ones((1, 1), dtype=np.bool_), TREE_MASK))


def graph_without_default(onnx_path: Path, out_path: Path) -> Path:
    """The graph at `onnx_path` with `past_lengths` as a plain input (no initializer), written to `out_path`
    (+ .data): what TensorRT parses, so that the engine takes per-sequence lengths. A graph without the default
    is returned as is (`onnx_path`)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    if not any(t.name == PAST_LENGTHS for t in model.graph.initializer):
        return Path(onnx_path)
    model = onnx.load(str(onnx_path), load_external_data=True)
    for t in [t for t in model.graph.initializer if t.name in (PAST_LENGTHS, TREE_MASK)]:
        model.graph.initializer.remove(t)  # TensorRT: real inputs (tree_mask: its profiles, bundle/profiles.py)
    return save_onnx(model, out_path)
