"""The draft head's validation calls: `SHAPES` (prefill-, draft- and catch-up-shaped) with `sample_inputs`, and
`validate_head`, the exported fp32 graph against the PyTorch module on each. The quantized graph's own check
(compiler/draft_head_quantize.py) runs the same calls first.

A fused head (specrt/models/draft_head_fused.py) has one more input, `layer_features [1,S,n,D]` (graph_io.py);
`graph_module(head)` takes the inputs in the graph's order (`input_names(head)`), which the export and every
check call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from torch import nn

from specrt.bundle.graph_io import FUSED_HEAD_INPUTS, HEAD_INPUTS as INPUTS, HEAD_OUTPUTS as OUTPUTS
from specrt.compiler.validate import ValidationError
from specrt.models.draft_head import DraftHead

SHAPES = ((4, 0), (1, 4), (3, 5), (1, 9))  # (new rows S, past P) validated


def feature_layers(head: DraftHead) -> tuple[int, ...]:
    """A fused head's target layers, () for a plain head."""
    return tuple(getattr(head, "feature_layers", ()))


def input_names(head: DraftHead) -> tuple[str, ...]:
    return FUSED_HEAD_INPUTS if feature_layers(head) else INPUTS


class _FusedGraphOrder(nn.Module):
    """The fused head with its inputs in the graph's order (layer_features second)."""

    def __init__(self, head: DraftHead) -> None:
        super().__init__()
        self.head = head

    def forward(self, features, layer_features, input_ids, position_ids, past_key, past_value):
        return self.head(features, input_ids, position_ids, past_key, past_value, layer_features)


def graph_module(head: DraftHead) -> nn.Module:
    """`head` taking the graph's inputs (`input_names(head)`) positionally."""
    return _FusedGraphOrder(head).eval() if feature_layers(head) else head


def sample_inputs(head: DraftHead, s: int, p: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random inputs in the graph's order (`input_names(head)`)."""
    c = head.config
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, s, c.hidden_size, generator=g)
    ids = torch.randint(0, c.vocab_size, (1, s), generator=g)
    pos = torch.arange(p, p + s)[None, :]
    kv = (1, p, c.num_kv_heads, c.head_dim)
    out = (feats, ids, pos, torch.randn(kv, generator=g), torch.randn(kv, generator=g))
    n = len(feature_layers(head))
    if n:  # the residual stream's scale is larger than the final feature's: the head RMS-normalises it
        layers = 10.0 * torch.randn(1, s, n, c.hidden_size, generator=g)
        out = (feats, layers, *out[1:])
    return out


def validate_head(head: DraftHead, path: Path, atol: float = 1e-4, rtol: float = 1e-3) -> dict:
    """Run the graph and the module on every SHAPES call; raise ValidationError beyond the bound."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst, module, names = 0.0, graph_module(head), input_names(head)
    for i, (s, p) in enumerate(SHAPES):
        args = sample_inputs(head, s, p, seed=i + 1)
        got = sess.run(list(OUTPUTS), {n: a.numpy() for n, a in zip(names, args)})
        with torch.no_grad():
            ref = [t.numpy() for t in module(*args)]
        for name, a, b in zip(OUTPUTS, got, ref):
            diff = float(np.abs(a - b).max())
            if not np.isfinite(a).all() or diff > atol + rtol * float(np.abs(b).max()):
                raise ValidationError(f"draft head output {name} (S={s}, P={p}) differs from PyTorch by {diff:.3g}")
            worst = max(worst, diff)
        if not np.array_equal(got[0].argmax(-1), ref[0].argmax(-1)):
            top2 = np.sort(ref[0], axis=-1)[..., -2:]
            if float((top2[..., 1] - top2[..., 0]).min()) > 1e-3:
                raise ValidationError(f"draft head argmax differs from PyTorch (S={s}, P={p})")
    return {"max_abs_diff": worst, "shapes": [list(x) for x in SHAPES]}
