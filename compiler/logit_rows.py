"""Prefill without a logits row per prompt token (portable graph).

`add_logit_start` rewrites an exported portable graph so that the lm_head reads
`hidden_states[:, logit_start:]`, where `logit_start` ([1] int64) is a graph input whose initializer
defaults to 0: a caller that does not feed it (TensorRT, which treats an input with an initializer as a
constant; the GPU runners; validation) gets every row's logits exactly as before, and the ONNX Runtime
runner feeds `S - 1` during prefill so a 1,000-token prompt computes one row of logits instead of 1,000.
The fused graph has the same ability through its `logit_positions` input (compiler/fused_graph.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import LOGIT_START
from specrt.compiler.onnx_io import save_onnx
from specrt.compiler.validate import Tolerance, _Worst, check_logits

PASS_THROUGH = ("Cast", "Identity")


def _lm_head_node(graph):
    """The MatMul/Gemm that produces `logits` (through Cast/Identity) from `hidden_states`, or None."""
    producers = {o: n for n in graph.node for o in n.output}
    name = graph_io.LOGITS
    while (node := producers.get(name)) is not None and node.op_type in PASS_THROUGH:
        name = node.input[0]
    if node is not None and node.op_type in ("MatMul", "Gemm") and node.input[0] == graph_io.HIDDEN_STATES:
        return node
    return None


def add_logit_start(onnx_path: Path) -> bool:
    """Insert the `logit_start` slice before the lm_head in place. False (file untouched) when the graph
    does not have the expected lm_head pattern."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(onnx_path), load_external_data=True)
    g = model.graph
    head = _lm_head_node(g)
    if head is None or head.op_type == "Gemm":  # Gemm takes 2-D inputs: no [1, S, hidden] slice there
        return False
    g.input.append(helper.make_tensor_value_info(LOGIT_START, TensorProto.INT64, [1]))
    g.initializer.extend([numpy_helper.from_array(np.zeros(1, dtype=np.int64), LOGIT_START),
                          numpy_helper.from_array(np.array([np.iinfo(np.int64).max]), "logit_rows.end"),
                          numpy_helper.from_array(np.array([1], dtype=np.int64), "logit_rows.axes")])
    index = list(g.node).index(head)  # hidden_states is produced before the lm_head: insert right there
    g.node.insert(index, helper.make_node("Slice", [graph_io.HIDDEN_STATES, LOGIT_START, "logit_rows.end",
                                                    "logit_rows.axes"], ["logit_rows"], name="logit_rows"))
    head.input[0] = "logit_rows"
    save_onnx(model, onnx_path)
    return True


def validate_logit_start(decoder, onnx_path: Path, s: int = 7, p: int = 5, tolerance=None) -> None:
    """With logit_start = S - 1 the graph returns one row equal to the PyTorch reference's last row (the same
    scale-aware rule and greedy check as every validated output, validate.py)."""
    import onnxruntime as ort
    import torch

    from specrt.compiler.export import sample_inputs

    ids, pos, past = sample_inputs(decoder, s, p, seed=11)
    feeds = {graph_io.INPUT_IDS: ids.numpy(), graph_io.POSITION_IDS: pos.numpy(),
             LOGIT_START: np.array([s - 1], dtype=np.int64)}
    for i in range(decoder.config.num_layers):
        feeds[graph_io.past_key(i)] = past[2 * i].float().numpy()
        feeds[graph_io.past_value(i)] = past[2 * i + 1].float().numpy()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only (see module docstring: the defaulted input warns)
    session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    last = session.run([graph_io.LOGITS], feeds)[0]
    with torch.no_grad():
        ref = decoder(ids, pos, past[0::2], past[1::2]).logits[:, -1:].float().numpy()
    check_logits(f"{Path(onnx_path).name} with {LOGIT_START}={s - 1}", last, ref, tolerance or Tolerance(), _Worst())
