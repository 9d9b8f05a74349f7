"""Clean the exported portable graph (standard ONNX ops; what TensorRT and `ort-portable` run).

torch's exporter (with `optimize=False`, which keeps parameter names) leaves thousands of nodes that only
compute shapes and constants (Constant, Reshape/Cast chains, CastLike) and feeds every projection weight
through a `Transpose`. `clean_portable_graph` rewrites the file in place with well-kept tools:

1. weights in the layout the MatMul consumes: an initializer whose every user is `Transpose(perm=[1, 0])`
   is stored transposed under `<name>` + `graph_io.TRANSPOSED` and the Transposes disappear (a tied
   embedding, also read by `Gather`, keeps its layout: ORT and TensorRT fold that one Transpose at load);
2. onnxscript's constant folding and default rewrite rules, then onnx-ir's unused-node removal and
   common-subexpression elimination after equal small constants are merged. Folding never consumes a parameter (`decoder.*` initializers), and
   initializers are not deduplicated, so every parameter stays addressable by name: the PyTorch reference
   runner rebuilds the model from them (runtime/backends/pytorch/runner.py).

Fusing the Q/K/V and gate/up projections is left to the fused ONNX Runtime graph (compiler/fused_graph.py)
and to TensorRT's own horizontal fusion; concatenated weights would lose the parameter names.
The cleaned graph is validated against PyTorch exactly as before (compiler/validate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specrt.bundle.graph_io import PARAMETER_PREFIX, TRANSPOSED


@dataclass(frozen=True)
class CleanReport:
    nodes_before: int
    nodes_after: int
    transposed_weights: int


def _is_matrix_transpose(node) -> bool:
    perm = node.attributes.get("perm")
    return node.op_type == "Transpose" and node.domain == "" and perm is not None and tuple(perm.value) == (1, 0)


def store_weights_transposed(graph) -> int:
    """Step 1 on an onnx_ir graph: replace `Transpose(W)` by a pre-transposed initializer. Returns the count."""
    import numpy as np
    import onnx_ir as ir

    count = 0
    for name, value in list(graph.initializers.items()):
        users = [use.node for use in value.uses()]
        if (not name.startswith(PARAMETER_PREFIX) or value.is_graph_input() or value.is_graph_output()
                or not users or not all(_is_matrix_transpose(n) for n in users) or value.const_value is None):
            continue
        array = np.ascontiguousarray(value.const_value.numpy().T)  # [in, out]: what MatMul(x, W) reads
        stored = ir.Value(name=name + TRANSPOSED, shape=ir.Shape(array.shape), type=value.type,
                          const_value=ir.tensor(array, name=name + TRANSPOSED))
        graph.register_initializer(stored)
        for node in users:
            node.outputs[0].replace_all_uses_with(stored)
            graph.remove(node, safe=True)
        graph.initializers.pop(name)
        count += 1
    return count


def _keeps_parameters(node) -> bool | None:
    """Folding hook: never fold a node that reads a parameter (its name must survive); else default rules."""
    if any(v is not None and v.is_initializer() and v.name.startswith(PARAMETER_PREFIX) for v in node.inputs):
        return False
    return None


def merge_equal_constants(graph, max_bytes: int = 1024) -> None:
    """Small non-parameter initializers with equal type, shape and bytes become one (so that CSE can merge the
    shape and mask arithmetic the exporter repeats per layer). Parameters keep their names: never merged."""
    seen = {}
    for name, value in list(graph.initializers.items()):
        tensor = value.const_value
        if (name.startswith(PARAMETER_PREFIX) or tensor is None or value.is_graph_input() or value.is_graph_output()
                or tensor.nbytes > max_bytes):
            continue
        key = (tensor.dtype, tuple(tensor.shape), tensor.tobytes())
        if key in seen:
            value.replace_all_uses_with(seen[key])
            graph.initializers.pop(name)
        else:
            seen[key] = value


def clean_portable_graph(path: Path) -> CleanReport:
    """Rewrite the exported graph at `path` (+ `path.data`) in place; returns node counts before/after."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common
    from onnxscript import optimizer, rewriter

    path = Path(path)
    model = ir.load(str(path))
    before = model.graph.num_nodes()
    transposed = store_weights_transposed(model.graph)
    for _ in range(2):  # folding exposes rewrites and the other way round; two rounds reach a fixed point here
        optimizer.fold_constants(model, should_fold=_keeps_parameters)
        rewriter.rewrite(model)
        common.RemoveUnusedNodesPass()(model)
    common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    merge_equal_constants(model.graph)
    common.CommonSubexpressionEliminationPass()(model)
    common.RemoveUnusedNodesPass()(model)
    common.RemoveUnusedOpsetsPass()(model)
    after = model.graph.num_nodes()
    tmp = path.with_suffix(".clean.onnx")
    data = Path(str(tmp) + ".data")
    ir.save(model, str(tmp), external_data=data.name, size_threshold_bytes=1024)
    del model  # drops the memory maps of the old data file before it is replaced
    tmp.replace(path)
    data.replace(Path(str(path) + ".data"))
    _point_external_data_at(path)
    return CleanReport(before, after, transposed)


def _point_external_data_at(path: Path) -> None:
    """The renamed data file: rewrite the `location` of every external tensor to `<path>.data`."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = path.name + ".data"
    onnx.save_model(model, str(path))
