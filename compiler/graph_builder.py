"""`GraphBuilder`: collects ONNX nodes and initializers for the graphs specrt writes by hand (the fused graph,
compiler/fused_graph.py; the screened LM head, compiler/lm_head_screen.py)."""

from __future__ import annotations

import numpy as np

MS = "com.microsoft"  # the domain of ONNX Runtime's contrib ops (GroupQueryAttention, MatMulNBits, ...)


class GraphBuilder:
    """Collects nodes and initializers; `op` returns the output name(s) of the node it adds."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.inits: list = []
        self._count = 0
        self.tree = None  # the token-tree tensors every attention node reads (compiler/fused_tree.TreeInputs)

    def weight(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name))
        return name

    def const_i64(self, name: str, values: list[int]) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", name: str | None = None,
           outputs: list[str] | None = None, **attrs):
        from onnx import helper

        self._count += 1
        base = name or f"{op_type}_{self._count}"
        outs = outputs or [f"{base}/out{j}" for j in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs
