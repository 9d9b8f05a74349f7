"""`validate_onnx`: run an exported graph in ONNX Runtime and compare it with the PyTorch module.

Random inputs at several (S new tokens, P past) shapes covering prefill, decode and verify; every output
(logits, hidden states, new K/V) must match within tolerance (fp32: atol = rtol = 1e-4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..core.errors import SpecrtError
from ..models import Decoder
from ..bundle import graph_io
from .export import sample_inputs


class ValidationError(SpecrtError):
    exit_code = 1


def validation_shapes(max_seq_len: int, max_draft_tokens: int) -> list[tuple[int, int]]:
    """(S, P) pairs: prefill with empty past, decode, verify, and a verify near the context limit."""
    verify = max_draft_tokens + 1
    far = max(0, min(max_seq_len - verify, 64))
    return [(min(7, max_seq_len), 0), (1, 5), (verify, 9), (verify, far)]


def validate_onnx(decoder: Decoder, onnx_path: Path, shapes: list[tuple[int, int]],
                  atol: float = 1e-4, rtol: float = 1e-4) -> dict:
    """Compare ORT and PyTorch on `shapes`; raise ValidationError beyond tolerance. Returns the stats."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ValidationError(
            "validating the exported graph needs ONNX Runtime: pip install 'specrt[cpu]' (or 'specrt[gpu]')"
        ) from None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, min(4, torch.get_num_threads()))
    session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    c = decoder.config
    names = graph_io.output_names(c.num_layers)
    worst = {"max_abs_diff": 0.0, "max_rel_excess": 0.0, "shapes": shapes, "atol": atol, "rtol": rtol}
    for seed, (s, p) in enumerate(shapes):
        ids, pos, past = sample_inputs(decoder, s, p, seed=seed)
        feeds = {graph_io.INPUT_IDS: ids.numpy(), graph_io.POSITION_IDS: pos.numpy()}
        for i in range(c.num_layers):
            feeds[graph_io.past_key(i)] = past[2 * i].float().numpy()
            feeds[graph_io.past_value(i)] = past[2 * i + 1].float().numpy()
        got = session.run(names, feeds)
        with torch.no_grad():
            ref = decoder(ids, pos, past[0::2], past[1::2])
        expected = [ref.logits, ref.hidden_states] + [t for kv in zip(ref.new_keys, ref.new_values) for t in kv]
        for name, g, e in zip(names, got, expected):
            e = e.float().numpy()
            if g.shape != e.shape:
                raise ValidationError(f"{onnx_path.name}: output {name} has shape {g.shape}, expected {e.shape}")
            diff = np.abs(g.astype(np.float32) - e)
            worst["max_abs_diff"] = max(worst["max_abs_diff"], float(diff.max(initial=0.0)))
            excess = float((diff - (atol + rtol * np.abs(e))).max(initial=-1.0))
            worst["max_rel_excess"] = max(worst["max_rel_excess"], excess)
            if excess > 0:
                raise ValidationError(
                    f"{onnx_path.name}: output {name} differs from PyTorch at S={s}, P={p}: "
                    f"max |diff| = {diff.max():.3g} > atol {atol} + rtol {rtol}"
                )
    return worst
