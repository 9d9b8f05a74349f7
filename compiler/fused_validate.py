"""`validate_fused_onnx`: run the fused graph in ONNX Runtime and compare it with the PyTorch module.

The same (S new tokens, P past) shapes as the portable graph's validation (compiler/validate.py), with the
same random inputs: the past keys/values are written into rows [0, P) of [1, Hkv, C, D] buffers that are
bound as both past_* and present_* (as the runner does), and the present rows [P, P + S) must equal the
reference's new keys/values. Logits are checked at every position (logit_positions = 0..S-1) and at the
last one alone (the prefill form).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specrt.models import Decoder
from specrt.bundle import graph_io
from specrt.compiler.export import sample_inputs
from specrt.bundle.graph_io import (LM_HEAD_FULL, LOGIT_POSITIONS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH, present_key,
                                    present_value)
from specrt.compiler.validate import Tolerance, ValidationError, _check_tensor, _Worst, check_logits, validation_session


def run_fused(session, ids: np.ndarray, positions: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray],
              past_len: int, full_rows: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One call with the KV buffers (L x [1, Hkv, C, D], updated in place) bound as past and present.

    ids: [1, S] int64; positions: [R] int64 (logit rows); `full_rows` (a graph with a screened LM head): the
    `lm_head_full` input. Returns (logits [1, R, V], hidden [1, S, H]).
    """
    binding = session.io_binding()
    if full_rows is not None:
        import onnxruntime as ort

        binding.bind_ortvalue_input(LM_HEAD_FULL, ort.OrtValue.ortvalue_from_numpy(np.array(full_rows)))
    total = past_len + ids.shape[1]
    binding.bind_cpu_input(graph_io.INPUT_IDS, ids)
    binding.bind_cpu_input(LOGIT_POSITIONS, positions)
    binding.bind_cpu_input(SEQLENS_K, np.array([total - 1], dtype=np.int32))
    binding.bind_cpu_input(TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
    for i, (k, v) in enumerate(zip(keys, values)):
        for name_in, name_out, buf in ((graph_io.past_key(i), present_key(i), k),
                                       (graph_io.past_value(i), present_value(i), v)):
            binding.bind_input(name_in, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
            binding.bind_output(name_out, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
    binding.bind_output(graph_io.LOGITS, "cpu")
    binding.bind_output(graph_io.HIDDEN_STATES, "cpu")
    session.run_with_iobinding(binding)
    outs = binding.copy_outputs_to_cpu()  # in bind order: the presents (aliases) first, then these two
    return outs[-2], outs[-1]


def check_screened(where: str, screened: np.ndarray, full: np.ndarray, tol: Tolerance) -> bool:
    """A screened head's rows (compiler/lm_head_screen.py) against the same graph's full rows: every finite value
    within the tolerance of the full one, and the argmax the full row's (up to a tie within rounding). True when
    the rows took the screen (some -inf), False when the graph fell back to the full head."""
    s, f = screened.reshape(-1, screened.shape[-1]), full.reshape(-1, full.shape[-1])
    finite = np.isfinite(s)
    if not finite.any(axis=1).all() or np.isnan(s).any():
        raise ValidationError(f"{where}: the screened LM head returned a row without a finite logit")
    bound = tol.atol + tol.rtol * float(np.abs(f).max())
    diff = float(np.abs(np.where(finite, s - f, 0.0)).max())
    if diff > bound:
        raise ValidationError(f"{where}: the screened LM head's logits differ from the full head's by {diff:.3g} "
                              f"(bound {bound:.3g})")
    picked = f[np.arange(len(f)), s.argmax(axis=1)]
    if (picked < f.max(axis=1) - bound).any():
        raise ValidationError(f"{where}: the screened LM head chose another argmax than the full head")
    return not finite.all()


def validate_fused_onnx(decoder: Decoder, onnx_path: Path, shapes: list[tuple[int, int]], capacity: int,
                        tolerance: Tolerance | None = None, screen: bool = False) -> dict:
    """Compare the fused graph with PyTorch on `shapes` with the same rule as the portable graph (validate.py:
    per-tensor scale-aware bound, greedy agreement except near-ties, no NaN/inf); raise ValidationError.
    `screen`: the graph has a screened LM head, whose rows are checked against its full rows at every shape
    (`check_screened`)."""
    tol = tolerance or Tolerance()
    session = validation_session(onnx_path)
    c = decoder.config
    worst = _Worst()
    screened_calls = 0
    for seed, (s, p) in enumerate(shapes):
        ids, pos, past = sample_inputs(decoder, s, p, seed=seed)
        shape = (1, c.num_kv_heads, capacity, c.head_dim)
        keys = [np.zeros(shape, np.float32) for _ in range(c.num_layers)]
        values = [np.zeros(shape, np.float32) for _ in range(c.num_layers)]
        for i in range(c.num_layers):  # [1, P, Hkv, D] -> rows [0, P) of [1, Hkv, C, D]
            keys[i][:, :, :p] = past[2 * i].float().numpy().transpose(0, 2, 1, 3)
            values[i][:, :, :p] = past[2 * i + 1].float().numpy().transpose(0, 2, 1, 3)
        with torch.no_grad():
            ref = decoder(ids, pos, past[0::2], past[1::2])
        where = f"{onnx_path.name} at S={s}, P={p}"
        logits, hidden = run_fused(session, ids.numpy(), np.arange(s, dtype=np.int64), keys, values, p)
        check_logits(where, logits, ref.logits.float().numpy(), tol, worst)
        _check_tensor(where, graph_io.HIDDEN_STATES, hidden, ref.hidden_states.float().numpy(), tol, worst)
        for i in range(c.num_layers):
            for name, buf, new in ((present_key(i), keys[i], ref.new_keys[i]),
                                   (present_value(i), values[i], ref.new_values[i])):
                _check_tensor(where, name, buf[:, :, p:p + s].transpose(0, 2, 1, 3), new.float().numpy(), tol, worst)
        for i in range(c.num_layers):  # the prefill form: last row only, over the same past
            keys[i][:, :, p:], values[i][:, :, p:] = 0.0, 0.0
        last, _ = run_fused(session, ids.numpy(), np.array([s - 1], dtype=np.int64), keys, values, p)
        check_logits(f"{where} (last row)", last, ref.logits[:, -1:].float().numpy(), tol, worst)
        if screen:  # the same call with the screened head: rows [P, P + S) of the cache are written again alike
            for i in range(c.num_layers):
                keys[i][:, :, p:], values[i][:, :, p:] = 0.0, 0.0
            rows, _ = run_fused(session, ids.numpy(), np.arange(s, dtype=np.int64), keys, values, p, full_rows=False)
            screened_calls += check_screened(f"{where} (screened head)", rows, logits, tol)
    record = worst.record(tol, shapes)
    if screen:
        record["lm_head_screen"] = f"screen taken in {screened_calls} of {len(shapes)} calls"
    return record
