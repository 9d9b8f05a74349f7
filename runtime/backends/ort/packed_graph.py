"""The packed graph: several sequences' new tokens in ONE pass, each sequence attending to its own KV region.

Derived at load time from a bundle's fused graph (compiler/fused_graph.py) by rewriting each layer's one
GroupQueryAttention node; the weights stay in the bundle's external data file (nothing is written). Every op but
attention works row by row, so the packed graph feeds all sequences' rows as one sequence of N rows
(`input_ids [1, N]`); each layer splits its q/k/v rows by slot (`slot_rows [n]`), runs one GroupQueryAttention per
slot at batch 1 on that slot's own past/present buffers and lengths, and concatenates the outputs again.

Why: ONNX Runtime's CPU GroupQueryAttention refuses several sequences with several new tokens and a past ("batch_size
must be 1 when sequence_length > 1 and past context is given"), so a batched graph can only decode one token per
sequence. Here each slot's node is a batch-1 call, exactly the call the sequence would make alone (same rows, same
past length, same kernel path), so a slot may carry a prefill chunk, a verify pass over its drafts, or a one-token
decode (two rows for a target whose calls are padded to `min_rows`), all in the same pass; and its rows equal the
rows of that call alone whenever the row-wise ops are row-invariant (fp32 GEMM over pre-packed weights,
MatMulNBits' several-row kernel: tests/runtime/test_packed_pass.py, DESIGN.md "Batching").

A slot without rows this pass still runs its node (GroupQueryAttention refuses zero rows) on one constant zero row
with no past, whose output row is dropped: the caller binds such a slot's buffers to a scratch buffer, never a live
region. Per slot s the graph inputs are `past_key.{i}.{s}` / `past_value.{i}.{s}` ([1, Hkv, C_s, D], bound in place
as `present_*.{i}.{s}`), and `slot_seqlens_k [n]`, `slot_total [n]` (int32: past + rows - 1, past + rows; for an
empty slot 0 and 1), `slot_rows [n]` and `slot_take [n]` (int64: rows, max(rows, 1)).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import SEQLENS_K, TOTAL_SEQUENCE_LENGTH
from specrt.runtime.backends.ort.tree_strip import strip_tree

IN_ROWS, OUT_ROWS, SLOT_TAKE = "packed_in_rows", "packed_out_rows", "slot_take"
SLOT_SEQLENS, SLOT_TOTAL = "slot_seqlens_k", "slot_total"


def slot_name(name: str, s: int) -> str:
    return f"{name}.{s}"


def packed_model(fused_path: Path, n_slots: int):
    """The packed graph of `fused_path` for `n_slots` slots, as an onnx.ModelProto whose initializers still point at
    the fused graph's external data (create the session with `external_folder = fused_path.parent`)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(fused_path), load_external_data=False)
    strip_tree(model)  # batched passes verify chains (tree_strip.py)
    g = model.graph
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    if not gqa:
        raise ValueError(f"{fused_path} has no GroupQueryAttention node (not a fused graph)")
    new_nodes: list = []
    extra_inits: list = []
    zero_rows: dict[int, str] = {}

    def zero_row(width: int) -> str:  # the row an empty slot's attention reads (its output row is dropped)
        if width not in zero_rows:
            name = f"packed/zero_row_{width}"
            extra_inits.append(numpy_helper.from_array(np.zeros((1, 1, width), np.float32), name))
            zero_rows[width] = name
        return zero_rows[width]

    widths = _input_widths(model, gqa[0])
    for node in g.node:
        if node.op_type != "GroupQueryAttention":
            new_nodes.append(node)
            continue
        p = node.name or node.output[0]
        qkv = list(node.input[:3])
        pieces: dict[str, list[str]] = {}
        for j, x in enumerate(qkv):
            if not x:
                continue
            # rows of every slot in slot order, an empty slot's one row taken from the appended zero row
            cat, gathered = f"{p}/pad{j}", f"{p}/slot_rows{j}"
            new_nodes.append(helper.make_node("Concat", [x, zero_row(widths[j])], [cat], axis=1, name=cat))
            new_nodes.append(helper.make_node("Gather", [cat, IN_ROWS], [gathered], axis=1, name=gathered))
            outs = [f"{p}/split{j}.{s}" for s in range(n_slots)]
            new_nodes.append(helper.make_node("Split", [gathered, SLOT_TAKE], outs, axis=1, name=f"{p}/split{j}"))
            pieces[x] = outs
        outs = []
        for s in range(n_slots):
            ins = [pieces[x][s] if x else "" for x in qkv] + [
                slot_name(node.input[3], s), slot_name(node.input[4], s), slot_name(SLOT_SEQLENS, s),
                slot_name(SLOT_TOTAL, s), *node.input[7:]]
            out = f"{p}/out.{s}"
            attn = helper.make_node("GroupQueryAttention", ins,
                                    [out, slot_name(node.output[1], s), slot_name(node.output[2], s)],
                                    name=f"{p}.{s}", domain=node.domain)
            attn.attribute.extend(node.attribute)
            new_nodes.append(attn)
            outs.append(out)
        cat = f"{p}/out_slots"
        new_nodes.append(helper.make_node("Concat", outs, [cat], axis=1, name=cat))
        new_nodes.append(helper.make_node("Gather", [cat, OUT_ROWS], [node.output[0]], axis=1, name=f"{p}/out_rows"))

    inputs = []
    for i in g.input:
        if i.name in (SEQLENS_K, TOTAL_SEQUENCE_LENGTH):
            continue
        inputs += [_slot_value_info(i, s) for s in range(n_slots)] if i.name.startswith("past_") else [i]
    inputs += [helper.make_tensor_value_info(IN_ROWS, TensorProto.INT64, ["T"]),
               helper.make_tensor_value_info(OUT_ROWS, TensorProto.INT64, ["N"]),
               helper.make_tensor_value_info(SLOT_TAKE, TensorProto.INT64, [n_slots])]
    for s in range(n_slots):
        inputs += [helper.make_tensor_value_info(slot_name(SLOT_SEQLENS, s), TensorProto.INT32, [1]),
                   helper.make_tensor_value_info(slot_name(SLOT_TOTAL, s), TensorProto.INT32, [1])]
    outputs = []
    for o in g.output:
        outputs += [_slot_value_info(o, s) for s in range(n_slots)] if o.name.startswith("present_") else [o]
    graph = helper.make_graph(new_nodes, g.name + "-packed", inputs, outputs, list(g.initializer) + extra_inits)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                             producer_name="specrt-packed")


def _slot_value_info(vi, s: int):
    """A copy of a KV value_info for slot s, its dims renamed per slot (each slot's buffer has its own capacity)."""
    from onnx import helper

    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else f"{d.dim_param}_{s}" for d in t.shape.dim]
    return helper.make_tensor_value_info(slot_name(vi.name, s), t.elem_type, dims)


def _input_widths(model, node) -> list[int]:
    """Feature widths of a GroupQueryAttention node's q/k/v inputs (packed QKV: one width), from its attributes."""
    attrs = {a.name: a.i for a in node.attribute if a.type == a.INT}
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    kv_dim = next(i for i in model.graph.input if i.name == node.input[3]).type.tensor_type.shape.dim
    head_dim = kv_dim[3].dim_value
    if not node.input[1]:  # packed q, k, v
        return [(heads + 2 * kv_heads) * head_dim, 0, 0]
    return [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]


def packed_session(ort, fused_path: Path, n_slots: int, threads: int | None, alternating: bool = False):
    """InferenceSession of the packed graph, the weights read from the fused graph's external data."""
    from specrt.runtime.backends.ort.runner import session_options

    opts = session_options(ort, threads, alternating)
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(fused_path.parent))
    proto = packed_model(fused_path, n_slots)
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
