"""The ragged graph: several sequences' new tokens in ONE pass with ONE GroupQueryAttention per layer.

Derived at load time from a bundle's fused graph (compiler/fused_graph.py), like the packed graph
(packed_graph.py), but for ONNX Runtime builds whose GroupQueryAttention reads `query_seqlens` (input 16, ONNX
Runtime 1.32): right-padded query chunks of several sequences, each with its own past, in one batched call. The
row-wise ops still see every sequence's rows as one sequence of N rows (`input_ids [1, N]`, no padding in the
MatMuls); before each layer's attention the q/k/v rows are gathered into a [B, S, d] batch (`ragged_in_rows
[B*S]`: entry b's rows, then the index of an appended zero row as right padding), the one attention node runs
with `query_seqlens [B]` (rows of each entry that count) and `seqlens_k [B]` (past + counted rows - 1) on the
pool's buffers `[B, Hkv, C, D]` bound whole (entry b is region b, updated in place), and its [B, S, hidden]
output is gathered back to the N rows (`ragged_out_rows [N]`).

Why: the packed graph runs one batch-1 attention node per slot and layer (ONNX Runtime's ~20 us fixed cost per
node, 240 nodes at 8 slots on SmolLM2); here there are 30. Each entry's rows equal that sequence's call alone,
bit for bit, because the kernel computes entry b from its own counted rows only: its matrix products have
`query_seqlens[b]` rows, as the call alone has (tests/runtime/test_ragged_graph.py). A target whose calls alone
are padded to two rows (min_rows) counts its zero padding row (`attn_rows`), since a one-row product takes
another kernel (runtime/batch/ragged.py). An entry with no rows counts 0 and its cache is untouched.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.bundle.graph_io import SEQLENS_K, TOTAL_SEQUENCE_LENGTH
from specrt.runtime.backends.ort.tree_strip import strip_tree

IN_ROWS, OUT_ROWS = "ragged_in_rows", "ragged_out_rows"
QUERY_SEQLENS = "ragged_query_seqlens"
BATCH_SHAPE, FLAT_SHAPE = "ragged_batch_shape", "ragged_flat_shape"  # int64 [3]: (B, S, -1) and (1, -1, width)
QUERY_SEQLENS_INPUT = 16  # GroupQueryAttention's input index of query_seqlens (com.microsoft schema, ORT 1.32)


def ragged_supported(ort) -> bool:
    """Whether this ONNX Runtime's GroupQueryAttention takes `query_seqlens` (right-padded batched chunks)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C

        schema = next(s for s in C.get_all_operator_schema()
                      if s.name == "GroupQueryAttention" and s.domain == "com.microsoft")
    except (ImportError, StopIteration, AttributeError):
        return False
    names = [i.name for i in schema.inputs]
    return len(names) > QUERY_SEQLENS_INPUT and names[QUERY_SEQLENS_INPUT] == "query_seqlens"


def ragged_model(fused_path: Path):
    """The ragged graph of `fused_path` as an onnx.ModelProto whose initializers still point at the fused graph's
    external data (create the session with `external_folder = fused_path.parent`)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(fused_path), load_external_data=False)
    strip_tree(model)  # batched passes verify chains (tree_strip.py)
    g = model.graph
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    if not gqa:
        raise ValueError(f"{fused_path} has no GroupQueryAttention node (not a fused graph)")
    others = [n for n in g.node if n.op_type != "GroupQueryAttention"
              and {SEQLENS_K, TOTAL_SEQUENCE_LENGTH} & set(n.input)]
    if others:
        raise ValueError(f"{fused_path}: {others[0].op_type} reads the sequence lengths (not a fused graph)")
    nodes: list = []
    zero_rows: dict[int, str] = {}
    extra_inits: list = []

    def zero_row(width: int) -> str:  # the padding row every entry's short chunk is filled with
        if width not in zero_rows:
            name = f"ragged/zero_row_{width}"
            extra_inits.append(numpy_helper.from_array(np.zeros((1, 1, width), np.float32), name))
            zero_rows[width] = name
        return zero_rows[width]

    widths = _input_widths(model, gqa[0])
    for node in g.node:
        if node.op_type != "GroupQueryAttention":
            nodes.append(node)
            continue
        if len(node.input) > QUERY_SEQLENS_INPUT and node.input[QUERY_SEQLENS_INPUT]:
            raise ValueError(f"{fused_path}: {node.name} already reads query_seqlens")
        p = node.name or node.output[0]
        batched = []
        for j, x in enumerate(node.input[:3]):
            if not x:
                batched.append("")
                continue
            cat, rows, out = f"{p}/pad{j}", f"{p}/rows{j}", f"{p}/batch{j}"
            nodes.append(helper.make_node("Concat", [x, zero_row(widths[j])], [cat], axis=1, name=cat))
            nodes.append(helper.make_node("Gather", [cat, IN_ROWS], [rows], axis=1, name=rows))
            nodes.append(helper.make_node("Reshape", [rows, BATCH_SHAPE], [out], name=out))
            batched.append(out)
        rest = list(node.input[3:QUERY_SEQLENS_INPUT])
        ins = batched + rest + [""] * (QUERY_SEQLENS_INPUT - 3 - len(rest)) + [QUERY_SEQLENS]
        out = f"{p}/out_batch"
        attn = helper.make_node("GroupQueryAttention", ins, [out, *node.output[1:]], name=p, domain=node.domain)
        attn.attribute.extend(node.attribute)
        nodes.append(attn)
        flat = f"{p}/out_flat"
        nodes.append(helper.make_node("Reshape", [out, FLAT_SHAPE], [flat], name=flat))
        nodes.append(helper.make_node("Gather", [flat, OUT_ROWS], [node.output[0]], axis=1, name=f"{p}/out_rows"))
    inputs = list(g.input) + [
        helper.make_tensor_value_info(IN_ROWS, TensorProto.INT64, ["BS"]),
        helper.make_tensor_value_info(OUT_ROWS, TensorProto.INT64, ["N"]),
        helper.make_tensor_value_info(QUERY_SEQLENS, TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info(BATCH_SHAPE, TensorProto.INT64, [3]),
        helper.make_tensor_value_info(FLAT_SHAPE, TensorProto.INT64, [3])]
    graph = helper.make_graph(nodes, g.name + "-ragged", inputs, list(g.output), list(g.initializer) + extra_inits)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                             producer_name="specrt-ragged")


def attention_width(model) -> int:
    """Width of the attention output rows (num_heads * head_dim) of the fused graph's first attention node."""
    node = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: a.i for a in node.attribute if a.type == a.INT}
    kv_dim = next(i for i in model.graph.input if i.name == node.input[3]).type.tensor_type.shape.dim
    return attrs["num_heads"] * kv_dim[3].dim_value


def _input_widths(model, node) -> list[int]:
    from specrt.runtime.backends.ort.packed_graph import _input_widths as widths

    return widths(model, node)


def ragged_session(ort, fused_path: Path, threads: int | None, alternating: bool = False):
    """(InferenceSession of the ragged graph, its attention width), the weights read from the fused graph's
    external data."""
    from specrt.runtime.backends.ort.runner import session_options

    opts = session_options(ort, threads, alternating)
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(fused_path.parent))
    proto = ragged_model(fused_path)
    width = attention_width(proto)
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]), width
