"""The token-tree input of the fused graph (compiler/fused_graph.py; measurements and why in docs/trees.md).

`tree_mask [S', S']` bool (graph_io.TREE_MASK), an overridable initializer defaulting to [[True]]: new row i sees
new row j where `j <= i and tree_mask[i, j]` (broadcast: the default is the causal chain, so prefill, decode and
chain verify compute what they computed before the input existed). Once per pass, shared by every layer:

    visible [S, S] = (j <= i) & Expand(tree_mask)
    position_ids [B, S] = past_b + rowsum(visible) - 1          (past_b = seqlens_k[b] + 1 - S: past + depth)
    attention_bias [1, 1, S, T] = Pad(Where(visible, 0, -inf), P zero columns on the left)   (T = P + S)

which GroupQueryAttention (ONNX Runtime 1.32's CPU kernel reads both inputs with a past and several new rows,
exact: probed in tests/compiler/test_fused_tree.py) adds to its scores and uses for rotary. The kernel's sliding
window counts a row's index, not its position, so a windowed layer (Gemma 3) runs the kernel with a window of
W + TREE_WINDOW_SLACK and the bias masks the exact window by position: bias [B, 1, S, T] = -inf where
position - column >= W (exact for chains of any length and for trees of at most min(W, slack) rows: within a tree
an ancestor is fewer than S positions away). The runner writes only the S x S mask per tree pass.
"""

from __future__ import annotations

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import SEQLENS_K, TOTAL_SEQUENCE_LENGTH, TREE_MASK, TREE_WINDOW_SLACK

NEG_INF = np.float32(-np.inf)


class TreeInputs:
    """The per-pass tensors every layer's GroupQueryAttention reads (names in the graph)."""

    def __init__(self, g, c) -> None:
        from onnx import TensorProto

        self.g, self.c = g, c
        self._window_bias: dict[int, str] = {}
        i64 = lambda name, v: g.const_i64(f"tree/{name}", v)  # noqa: E731
        s = g.op("Shape", [graph_io.INPUT_IDS], start=1, end=2, name="tree/s")  # [1] = S
        s_scalar = g.op("Reshape", [s, i64("scalar", [])], name="tree/s_scalar")
        idx = g.op("Range", [_scalar(g, "tree/zero_s", 0), s_scalar,
                             _scalar(g, "tree/one_s", 1)], name="tree/range")  # [S]
        col = g.op("Reshape", [idx, i64("row_shape", [1, -1])], name="tree/cols")
        row = g.op("Reshape", [idx, i64("col_shape", [-1, 1])], name="tree/rows")
        causal = g.op("LessOrEqual", [col, row], name="tree/causal")  # [S, S]
        ss = g.op("Concat", [s, s], axis=0, name="tree/ss")
        given = g.op("Expand", [TREE_MASK, ss], name="tree/given")
        visible = g.op("And", [causal, given], name="tree/visible")  # [S, S] bool
        ones = g.op("ReduceSum", [g.op("Cast", [visible], to=TensorProto.INT64, name="tree/visible_i64"),
                                  i64("axis1", [1])], keepdims=0, name="tree/ancestors")  # [S]: depth + 1
        seqlens = g.op("Cast", [SEQLENS_K], to=TensorProto.INT64, name="tree/seqlens_i64")  # [B]
        base = g.op("Sub", [seqlens, s], name="tree/past_minus_one")  # [B]: past_b - 1
        self.positions = g.op("Add", [g.op("Reshape", [base, i64("col_shape2", [-1, 1])], name="tree/base_col"),
                                      g.op("Reshape", [ones, i64("row_shape2", [1, -1])], name="tree/ones_row")],
                              name="tree/position_ids")  # [B, S]
        zero = g.weight("tree/zero_f", np.array(0.0, np.float32))
        self._neg = g.weight("tree/neg_inf", np.array(NEG_INF, np.float32))
        block = g.op("Where", [visible, zero, self._neg], name="tree/block")  # [S, S]
        total = g.op("Cast", [g.op("Reshape", [TOTAL_SEQUENCE_LENGTH, i64("one_shape", [1])], name="tree/t1")],
                     to=TensorProto.INT64, name="tree/total_i64")  # [1] = T
        past = g.op("Sub", [total, s], name="tree/past")  # [1] = P
        pads = g.op("Concat", [i64("pad0", [0]), past, i64("pad_end", [0, 0])], axis=0, name="tree/pads")
        bias2d = g.op("Pad", [block, pads], name="tree/bias2d")  # [S, T]
        self._bias2d = bias2d
        self.bias = g.op("Unsqueeze", [bias2d, i64("axes01", [0, 1])], name="tree/attention_bias")  # [1, 1, S, T]
        self._total = total

    def window_bias(self, window: int) -> str:
        """[B, 1, S, T]: the tree bias plus -inf where a query's position - key column >= window."""
        if window in self._window_bias:
            return self._window_bias[window]
        g, p = self.g, f"tree/window{window}"
        t_scalar = g.op("Reshape", [self._total, g.const_i64(f"{p}/scalar", [])], name=f"{p}/t_scalar")
        cols = g.op("Range", [_scalar(g, f"{p}/zero", 0), t_scalar, _scalar(g, f"{p}/one", 1)], name=f"{p}/cols")
        q = g.op("Unsqueeze", [self.positions, g.const_i64(f"{p}/axis2", [2])], name=f"{p}/q")  # [B, S, 1]
        dist = g.op("Sub", [q, cols], name=f"{p}/dist")  # [B, S, T]
        far = g.op("GreaterOrEqual", [dist, _scalar(g, f"{p}/w", window)], name=f"{p}/far")
        bias = g.op("Where", [far, self._neg, self._bias2d], name=f"{p}/bias")  # [B, S, T]
        out = g.op("Unsqueeze", [bias, g.const_i64(f"{p}/axis1", [1])], name=f"{p}/attention_bias")  # [B, 1, S, T]
        self._window_bias[window] = out
        return out

    def attention_inputs(self, window: int | None) -> tuple[list[str], dict]:
        """(GroupQueryAttention inputs 9 and 10: position_ids, attention_bias; attributes for the window)."""
        if window is None:
            return [self.positions, self.bias], {}
        return [self.positions, self.window_bias(window)], {"local_window_size": window + TREE_WINDOW_SLACK}


def _scalar(g, name: str, value: int) -> str:
    from onnx import numpy_helper

    g.inits.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    return name


def tree_mask_input():
    """(graph input value info, default initializer): [[True]], the causal chain."""
    from onnx import TensorProto, helper, numpy_helper

    return (helper.make_tensor_value_info(TREE_MASK, TensorProto.BOOL, ["tree_rows", "tree_cols"]),
            numpy_helper.from_array(np.ones((1, 1), dtype=np.bool_), TREE_MASK))
