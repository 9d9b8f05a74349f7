"""`validate_onnx`: run an exported graph in ONNX Runtime and compare it with the PyTorch module.

Random inputs at several (S new tokens, P past) shapes covering prefill, decode and verify. Every output
(logits, hidden states, new K/V) must satisfy, per tensor,

    max |onnx - torch| <= atol + rtol * max |torch|

(a bound relative to the tensor's own scale: fp32 accumulation noise grows with depth and with the
magnitude of the values), the exported logits' argmax must equal the reference argmax at every position
unless the reference's top-2 margin is within that bound (a near-tie), and nothing may be NaN or inf.
Defaults (`Tolerance()`) are justified by measurement in DESIGN.md: SmolLM2-135M (30 layers, logits ~20)
shows max |diff| ~2e-3 on logits, i.e. ~1e-4 of the scale; an export bug (wrong rope theta, wrong
norm) is off by 10-100% of the scale.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from specrt.core.errors import SpecrtError
from specrt.models import Decoder
from specrt.bundle import graph_io
from specrt.compiler.export import sample_inputs
from specrt.compiler.tolerance import Tolerance  # noqa: F401  (re-exported: the compile steps import it here)


class ValidationError(SpecrtError):
    exit_code = 1


def validation_shapes(max_seq_len: int, max_draft_tokens: int) -> list[tuple[int, int]]:
    """(S, P) pairs: prefill with empty past, decode, verify, and a verify near the context limit."""
    verify = max_draft_tokens + 1
    far = max(0, min(max_seq_len - verify, 64))
    return [(min(7, max_seq_len), 0), (1, 5), (verify, 9), (verify, far)]


def window_shapes(config, max_seq_len: int, max_draft_tokens: int) -> list[tuple[int, int]]:
    """A verify whose past reaches beyond the sliding window (Gemma 3), when the context allows one."""
    verify = max_draft_tokens + 1
    if not config.windowed or max_seq_len <= config.sliding_window:
        return []
    return [(verify, min(max_seq_len - verify, config.sliding_window + 3))]


@dataclasses.dataclass
class _Worst:
    """Running worst case over shapes and outputs (what the manifest records)."""

    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0  # max |diff| / max |ref| of the same tensor
    logits_max_abs_diff: float = 0.0
    logits_scale: float = 0.0  # max |reference logits|
    positions: int = 0
    argmax_agree: int = 0
    near_ties: int = 0

    def record(self, tol: Tolerance, shapes: list) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff,
                "logits_max_abs_diff": self.logits_max_abs_diff, "logits_scale": self.logits_scale,
                "argmax_positions": self.positions, "argmax_agree": self.argmax_agree,
                "argmax_near_ties": self.near_ties, "atol": tol.atol, "rtol": tol.rtol,
                "shapes": [list(s) for s in shapes]}


def _hint(tol: Tolerance, needed_rtol: float) -> str:
    if needed_rtol < 0.01:
        return (f"this looks like floating-point accumulation noise: retry with --tolerance {tol.atol:g},"
                f"{needed_rtol * 2:.1g} if outputs stay identical")
    return "an error this large is an export bug or an unsupported model variant, not rounding noise"


def _check_tensor(where: str, name: str, got: np.ndarray, ref: np.ndarray, tol: Tolerance, worst: _Worst) -> float:
    """Raise unless `got` is finite and within tolerance of `ref`. Returns the bound used."""
    if got.shape != ref.shape:
        raise ValidationError(f"{where}: output {name} has shape {got.shape}, expected {ref.shape}")
    if not np.isfinite(got).all():
        bad = int((~np.isfinite(got)).sum())
        raise ValidationError(f"{where}: output {name} has {bad} non-finite values (NaN or inf)")
    if not np.isfinite(ref).all():
        raise ValidationError(f"{where}: the PyTorch reference's {name} has non-finite values (NaN or inf): the checkpoint "
                              "itself overflows in float32")
    scale = float(np.abs(ref).max(initial=0.0))
    diff = float(np.abs(got.astype(np.float32) - ref).max(initial=0.0))
    worst.max_abs_diff = max(worst.max_abs_diff, diff)
    worst.max_rel_diff = max(worst.max_rel_diff, diff / scale if scale else diff)
    bound = tol.bound(scale)
    if diff > bound:
        rel = diff / scale if scale else float("inf")
        raise ValidationError(
            f"{where}: output {name} differs from PyTorch: max |diff| = {diff:.3g} on values up to {scale:.3g} "
            f"({rel:.2g} of the scale) > atol {tol.atol:g} + rtol {tol.rtol:g} * {scale:.3g} = {bound:.3g}; "
            + _hint(tol, rel)
        )
    return bound


def _check_argmax(where: str, got: np.ndarray, ref: np.ndarray, bound: float, worst: _Worst) -> None:
    """got, ref: [1, S, vocab]. Argmax must agree unless the reference's top-2 margin is within 2 * bound."""
    g, r = got.reshape(-1, got.shape[-1]), ref.reshape(-1, ref.shape[-1])
    g_arg, r_arg = g.argmax(-1), r.argmax(-1)
    rows = np.arange(len(r))
    margin = r[rows, r_arg] - r[rows, g_arg]  # 0 where they agree
    worst.positions += len(r)
    worst.argmax_agree += int((g_arg == r_arg).sum())
    near = (g_arg != r_arg) & (margin <= 2 * bound)
    worst.near_ties += int(near.sum())
    bad = np.flatnonzero((g_arg != r_arg) & ~near)
    if len(bad):
        i = int(bad[0])
        raise ValidationError(
            f"{where}: greedy token differs from PyTorch at {len(bad)} of {len(r)} positions (first: position {i}, "
            f"ONNX picks {int(g_arg[i])}, PyTorch {int(r_arg[i])} by a margin of {float(margin[i]):.3g}, "
            f"more than the tolerance {2 * bound:.3g}): the export is wrong"
        )


def validation_session(onnx_path: Path):
    """A CPU ONNX Runtime session for validating a graph against PyTorch (every variant uses this one)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ValidationError(
            "validating the exported graph needs ONNX Runtime: pip install 'specrt[cpu]' (or 'specrt[gpu]')"
        ) from None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: the portable graph's defaulted logit_start input would warn on every load
    opts.intra_op_num_threads = max(1, min(4, torch.get_num_threads()))
    return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])


def check_logits(where: str, got: np.ndarray, ref: np.ndarray, tol: Tolerance, worst: _Worst) -> None:
    """Logits: the tensor bound, then greedy agreement (both graph variants use this)."""
    bound = _check_tensor(where, graph_io.LOGITS, got, ref, tol, worst)
    worst.logits_max_abs_diff = max(worst.logits_max_abs_diff, float(np.abs(got - ref).max(initial=0.0)))
    worst.logits_scale = max(worst.logits_scale, float(np.abs(ref).max(initial=0.0)))
    _check_argmax(where, got, ref, bound, worst)


def validate_onnx(decoder: Decoder, onnx_path: Path, shapes: list[tuple[int, int]],
                  tolerance: Tolerance | None = None) -> dict:
    """Compare ORT and PyTorch on `shapes`; raise ValidationError beyond tolerance. Returns the stats."""
    tol = tolerance or Tolerance()
    session = validation_session(onnx_path)
    c = decoder.config
    names = graph_io.output_names(c.num_layers)
    worst = _Worst()
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
        where = f"{onnx_path.name} at S={s}, P={p}"
        for name, g, e in zip(names, got, expected):
            e = e.float().numpy()
            if name == graph_io.LOGITS:
                check_logits(where, g, e, tol, worst)
            else:
                _check_tensor(where, name, g, e, tol, worst)
    return worst.record(tol, shapes)
