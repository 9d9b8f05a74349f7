"""`half_onnx_from_fp32`: convert the fp32 bundle graph to an fp16 or bf16 graph for a strongly typed engine.

TensorRT 11 networks are strongly typed (no FP16/BF16 builder flags): tensor types in the ONNX graph
decide the precision. The conversion, on the ONNX graph only (no PyTorch):

- float initializers, float Constant values and `Cast(to=FLOAT)` become the half type (fp16 values are
  clipped to +-65504 so that `finfo(float32).min` masks stay finite);
- float graph inputs / outputs (past_*, new_*, hidden_states) become the half type, except `logits`:
  the graph computes half logits and a final `Cast(to=FLOAT)` keeps the `logits` output fp32;
- fp32 islands, kept for accuracy: the rotary-embedding angles (every node upstream of a Cos / Sin:
  position * inv_freq in fp16 is off by radians at long positions) and, for fp16, the RMSNorm variance
  (Pow(x, 2) -> ReduceMean -> Add eps -> Sqrt -> Reciprocal/Div: x^2 overflows fp16 above |x| = 256).
  Casts are inserted wherever a float tensor crosses an island border.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.bundle import graph_io
from specrt.compiler.onnx_io import save_onnx

PRECISIONS = ("fp32", "fp16", "bf16")
FP16_MAX = 65504.0
_NORM_CHAIN = ("Add", "Sqrt", "Reciprocal", "Div")


def onnx_elem_type(precision: str) -> int:
    from onnx import TensorProto

    table = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
    if precision not in table:
        raise InvalidArgument(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    return table[precision]


def half_array(a: np.ndarray, precision: str) -> np.ndarray:
    """fp32 array -> fp16 (clipped to the fp16 range) or bf16 (ml_dtypes, round to nearest even)."""
    if precision == "fp16":
        return np.clip(a, -FP16_MAX, FP16_MAX).astype(np.float16)
    import ml_dtypes

    return a.astype(ml_dtypes.bfloat16)


def _half_tensor(t, precision: str):
    from onnx import numpy_helper

    out = numpy_helper.from_array(half_array(numpy_helper.to_array(t).astype(np.float32), precision), t.name)
    return out


def _fp32_islands(graph, precision: str) -> set[int]:
    """Indices of nodes that stay fp32: rotary angles (upstream of Cos/Sin) and, for fp16, RMSNorm variance."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    consumers = defaultdict(list)
    for i, n in enumerate(graph.node):
        for x in n.input:
            consumers[x].append(i)
    island: set[int] = set()
    stack = [i for i, n in enumerate(graph.node) if n.op_type in ("Cos", "Sin")]
    while stack:  # everything the rotary angles are computed from
        i = stack.pop()
        if i in island:
            continue
        island.add(i)
        stack += [producer[x] for x in graph.node[i].input if x in producer]
    if precision == "fp16":
        for i, n in enumerate(graph.node):
            if n.op_type != "ReduceMean" or n.input[0] not in producer:
                continue
            if graph.node[producer[n.input[0]]].op_type != "Pow":
                continue
            island |= {i, producer[n.input[0]]}
            j = i
            while len(consumers[graph.node[j].output[0]]) == 1:  # follow Add eps -> Sqrt -> Reciprocal
                j = consumers[graph.node[j].output[0]][0]
                if graph.node[j].op_type not in _NORM_CHAIN:
                    break
                island.add(j)
                if graph.node[j].op_type in ("Reciprocal", "Div"):
                    break
    return island


def _convert_attrs(node, precision: str, elem: int) -> None:
    from onnx import TensorProto, helper

    for a in node.attribute:
        if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
            a.i = elem
        elif a.type == a.TENSOR and a.t.data_type == TensorProto.FLOAT:
            a.t.CopyFrom(_half_tensor(a.t, precision))
    if node.op_type == "Constant":
        for a in list(node.attribute):
            if a.name in ("value_float", "value_floats"):
                vals = np.array(a.f if a.name == "value_float" else list(a.floats), dtype=np.float32)
                from onnx import numpy_helper

                t = numpy_helper.from_array(half_array(vals, precision))
                node.attribute.remove(a)
                node.attribute.append(helper.make_attribute("value", t))


def convert_model(model, precision: str, keep_fp32_logits: bool = True):
    """fp32 ModelProto (weights loaded) -> a new ModelProto in `precision`. fp32 returns a copy."""
    import onnx
    from onnx import TensorProto, helper

    elem = onnx_elem_type(precision)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if precision == "fp32":
        return out
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    g = out.graph
    island = _fp32_islands(g, precision)
    is_float = lambda name: types.get(name) == TensorProto.FLOAT  # noqa: E731
    # where each float tensor lives: True = fp32 (produced in an island or an island-only initializer)
    island_inputs = {x for i in island for x in g.node[i].input}
    other_inputs = {x for i, n in enumerate(g.node) if i not in island for x in n.input}
    lives32: dict[str, bool] = {o: (i in island) for i, n in enumerate(g.node) for o in n.output}
    for t in g.initializer:
        lives32[t.name] = t.name in island_inputs
        if t.data_type == TensorProto.FLOAT and not lives32[t.name]:
            t.CopyFrom(_half_tensor(t, precision))
    for v in g.input:
        lives32[v.name] = False
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = elem
    for i, n in enumerate(g.node):
        if i not in island:
            _convert_attrs(n, precision, elem)
    # casts at island borders
    new_nodes, renamed = [], {}
    for name in sorted((island_inputs | other_inputs) & set(lives32)):
        if not is_float(name):
            continue
        need_other = name in other_inputs and lives32[name]  # fp32 tensor read by half code
        need_island = name in island_inputs and not lives32[name]  # half tensor read by fp32 code
        if need_other:
            renamed[(name, False)] = f"{name}.to_half"
            new_nodes.append(helper.make_node("Cast", [name], [f"{name}.to_half"], to=elem, name=f"{name}.to_half"))
        if need_island:
            renamed[(name, True)] = f"{name}.to_fp32"
            new_nodes.append(helper.make_node("Cast", [name], [f"{name}.to_fp32"], to=TensorProto.FLOAT,
                                              name=f"{name}.to_fp32"))
    for i, n in enumerate(g.node):
        for k, x in enumerate(n.input):
            if (x, i in island) in renamed:
                n.input[k] = renamed[(x, i in island)]
    for v in g.output:
        if v.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        if v.name == graph_io.LOGITS and keep_fp32_logits:
            half_name = f"{graph_io.LOGITS}.half"
            for n in g.node:
                n.output[:] = [half_name if o == v.name else o for o in n.output]
                n.input[:] = [half_name if x == v.name else x for x in n.input]
            new_nodes.append(helper.make_node("Cast", [half_name], [v.name], to=TensorProto.FLOAT,
                                              name="logits_to_fp32"))
        elif lives32.get(v.name):
            raise InvalidArgument(f"graph output {v.name} is computed in an fp32 island; cannot convert")
        else:
            v.type.tensor_type.elem_type = elem
    g.node.extend(new_nodes)
    _toposort(g)
    del g.value_info[:]
    return out


def _toposort(g) -> None:
    """Reorder nodes so every input is produced before use (the inserted casts were appended)."""
    ready = {v.name for v in g.input} | {t.name for t in g.initializer} | {""}
    pending, ordered = list(g.node), []
    while pending:
        rest = []
        for n in pending:
            (ordered.append(n), ready.update(n.output)) if all(x in ready for x in n.input) else rest.append(n)
        if len(rest) == len(pending):
            raise InvalidArgument(f"graph has a cycle or a missing input near node {rest[0].name!r}")
        pending = rest
    del g.node[:]
    g.node.extend(ordered)


def half_onnx_from_fp32(src: Path, dst: Path, precision: str, keep_fp32_logits: bool = True) -> Path:
    """Read the fp32 graph at `src` (+ .data), write the converted graph to `dst` (+ `dst.name`.data)."""
    import onnx

    model = onnx.load(str(src), load_external_data=True)
    converted = convert_model(model, precision, keep_fp32_logits)
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    return save_onnx(converted, dst)
