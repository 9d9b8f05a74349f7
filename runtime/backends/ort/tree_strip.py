"""The fused graph without its token-tree input (compiler/fused_tree.py), for the load-time rewrites that batch
several sequences (packed_graph.py, ragged_graph.py): their attention nodes take each sequence's own lengths, and
batched passes verify chains (docs/trees.md), so the per-pass tree tensors (computed from the graph-wide
`seqlens_k` / `total_sequence_length`) are dropped and each GroupQueryAttention gets back its plain form: inputs
0..8, and a windowed layer's own window (the tree graph widens the kernel's by TREE_WINDOW_SLACK and masks the
exact window in its bias). A graph without the tree input is left as it is."""

from __future__ import annotations

from specrt.bundle.graph_io import TREE_MASK, TREE_WINDOW_SLACK

PREFIX = "tree/"
PLAIN_INPUTS = 9  # query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache


def strip_tree(model) -> bool:
    """Rewrite the onnx.ModelProto in place; returns whether it had the tree input."""
    g = model.graph
    if not any(i.name == TREE_MASK for i in g.input):
        return False
    kept = [n for n in g.node if not n.name.startswith(PREFIX)]
    for node in kept:
        if node.op_type != "GroupQueryAttention" or len(node.input) <= PLAIN_INPUTS:
            continue
        windowed = any(x.startswith(PREFIX + "window") for x in node.input[PLAIN_INPUTS:])
        del node.input[PLAIN_INPUTS:]
        if windowed:
            for a in node.attribute:
                if a.name == "local_window_size":
                    a.i -= TREE_WINDOW_SLACK
    del g.node[:]
    g.node.extend(kept)
    for field in (g.input, g.initializer):
        keep = [x for x in field if x.name != TREE_MASK and not x.name.startswith(PREFIX)]
        del field[:]
        field.extend(keep)
    return True
