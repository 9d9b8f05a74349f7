"""The target graphs' `hidden_layers` output, for a bundle whose draft head is fused (docs/draft-head.md).

A fused head (specrt/models/draft_head_fused.py) reads the target's residual stream after its `feature_layers`
(0-based: a decoder block's output) next to the final feature. Only in such a bundle the target graphs get one
more output, `hidden_layers` [B, S, n, hidden] (n = len(feature_layers), in that order); every other bundle's
graphs are unchanged.

* portable graph: the exporter stacks the blocks' outputs (compiler/export.py, `layer_taps` hooks);
* fused graph: the residual stream after block i is already a tensor, the `sum` output of the next
  SkipSimplifiedLayerNormalization (block i + 1's input norm, or the final norm after the last block): `add_output`
  stacks those (no extra arithmetic);
* `validate_hidden_layers`: either graph against the PyTorch decoder's block outputs on a call with a past.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specrt.bundle import graph_io
from specrt.compiler.validate import Tolerance, ValidationError


def residual_name(i: int, num_layers: int) -> str:
    """The fused graph's tensor holding the residual stream after block i (compiler/fused_layers.skip_norm)."""
    return f"layers.{i + 1}.input_layernorm/sum" if i + 1 < num_layers else "norm/sum"


def add_output(g, num_layers: int, layers: tuple[int, ...]) -> None:
    """Nodes of `hidden_layers` [B, S, n, D] in the fused graph being built by `g` (a GraphBuilder)."""
    axes = g.const_i64("hidden_layers.axes", [2])
    parts = [g.op("Unsqueeze", [residual_name(i, num_layers), axes], name=f"hidden_layers.{j}")
             for j, i in enumerate(layers)]
    g.op("Concat", parts, axis=2, name="hidden_layers", outputs=[graph_io.HIDDEN_LAYERS])


def output_spec(hidden_size: int, layers: tuple[int, ...]) -> dict:
    return {"name": graph_io.HIDDEN_LAYERS, "dtype": "float32", "shape": ["B", "S", len(layers), hidden_size]}


@torch.no_grad()
def validate_hidden_layers(decoder, onnx_path: Path, layers: tuple[int, ...], fused: bool, capacity: int = 0,
                           tolerance: Tolerance | None = None, s: int = 4, p: int = 3) -> dict:
    """The graph's `hidden_layers` on one call (S new rows after P past ones) against the decoder's block outputs;
    raises ValidationError beyond the tolerance (validate.py's scale-aware bound). Returns {max_abs_diff}."""
    import onnxruntime as ort

    from specrt.compiler.export import sample_inputs
    from specrt.models.draft_head_fused import layer_taps

    tol = tolerance or Tolerance()
    c = decoder.config
    ids, pos, past = sample_inputs(decoder, s, p, seed=7)
    got_ref, handles = layer_taps(decoder, layers)
    try:
        decoder(ids, pos, past[0::2], past[1::2])
    finally:
        for h in handles:
            h.remove()
    ref = torch.stack(got_ref, dim=2).float().numpy()
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    if fused:
        from specrt.bundle.graph_io import LOGIT_POSITIONS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH

        feeds = {graph_io.INPUT_IDS: ids.numpy(), LOGIT_POSITIONS: np.arange(s, dtype=np.int64),
                 SEQLENS_K: np.array([p + s - 1], np.int32), TOTAL_SEQUENCE_LENGTH: np.array(p + s, np.int32)}
        for i in range(c.num_layers):  # [1, P, Hkv, D] -> rows [0, P) of [1, Hkv, C, D]
            for name, t in ((graph_io.past_key(i), past[2 * i]), (graph_io.past_value(i), past[2 * i + 1])):
                buf = np.zeros((1, c.num_kv_heads, max(capacity, p + s), c.head_dim), np.float32)
                buf[:, :, :p] = t[:1].float().numpy().transpose(0, 2, 1, 3)
                feeds[name] = buf
        ref = ref[:1]
        feeds[graph_io.INPUT_IDS] = feeds[graph_io.INPUT_IDS][:1]
    else:
        feeds = {n: t.numpy() for n, t in zip(graph_io.input_names(c.num_layers), (ids, pos, *past))}
    (got,) = sess.run([graph_io.HIDDEN_LAYERS], feeds)
    diff = float(np.abs(got - ref).max())
    bound = tol.atol + tol.rtol * float(np.abs(ref).max())
    if got.shape != ref.shape or not np.isfinite(got).all() or diff > bound:
        raise ValidationError(f"{onnx_path.name}: {graph_io.HIDDEN_LAYERS} {got.shape} differs from the PyTorch "
                              f"decoder's layers {list(layers)} {ref.shape} by {diff:.3g} (bound {bound:.3g})")
    return {"max_abs_diff": diff, "layers": list(layers)}
