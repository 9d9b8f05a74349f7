"""The draft head's validation calls: `SHAPES` (prefill-, draft- and catch-up-shaped) with `sample_inputs`, and
`validate_head`, the exported fp32 graph against the PyTorch module on each. The quantized graph's own check
(compiler/draft_head_quantize.py) runs the same calls first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specrt.bundle.graph_io import HEAD_INPUTS as INPUTS, HEAD_OUTPUTS as OUTPUTS
from specrt.compiler.validate import ValidationError
from specrt.models.draft_head import DraftHead

SHAPES = ((4, 0), (1, 4), (3, 5), (1, 9))  # (new rows S, past P) validated


def sample_inputs(head: DraftHead, s: int, p: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    c = head.config
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, s, c.hidden_size, generator=g)
    ids = torch.randint(0, c.vocab_size, (1, s), generator=g)
    pos = torch.arange(p, p + s)[None, :]
    kv = (1, p, c.num_kv_heads, c.head_dim)
    return feats, ids, pos, torch.randn(kv, generator=g), torch.randn(kv, generator=g)


def validate_head(head: DraftHead, path: Path, atol: float = 1e-4, rtol: float = 1e-3) -> dict:
    """Run the graph and the module on every SHAPES call; raise ValidationError beyond the bound."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for i, (s, p) in enumerate(SHAPES):
        args = sample_inputs(head, s, p, seed=i + 1)
        got = sess.run(list(OUTPUTS), {n: a.numpy() for n, a in zip(INPUTS, args)})
        with torch.no_grad():
            ref = [t.numpy() for t in head(*args)]
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
